"""A scorer bug is the suite's, and it speaks: `rao train --check` scores the suite's tasks and one
expert tree per difficulty and refuses a scorer that raises or leaves [0, 1] (a dataset's verifier
too, on the rows' own answers); a rollout says its first scorer failure at once, in one line, and
a round where the scorer failed at half the nodes or more stops with the scorer's message, exit 1,
set aside to be sampled again."""

from __future__ import annotations

import hashlib
import re
import sys

import pyarrow as pa
import pytest

from flows.cli import main
from rao_core.agent import node
from rao_core.errors import is_scorer_failure, scorer_is_broken
from rao_core.eval.metrics import summarize
from rao_core.stages.report import failure_counts
from rao_core.store.schema import NODE_SCHEMA
from tests.envs.test_dataset_suite import data_rows

# EchoSuite (tests/envs/test_suite_plugins.py) with an expert, and scorers with the bugs users write.
SCORERS = """
from rao_core.policy import Generation, Policy
from usertasks.echo import EchoEnv, EchoSuite


class Say(Policy):
    async def generate(self, request):
        return Generation(text="<python>\\nfinish(shout('yes'))\\n</python>")


class Percent(EchoEnv):
    def success(self, finished, finish_message):
        return 100.0 * (finished and finish_message == "YES")


class Typo(EchoEnv):
    def success(self, finished, finish_message):
        return float(finished and finish_message == self.targets()["wrod"])


class Never(EchoEnv):
    def success(self, finished, finish_message):
        return 0.0


def suite_of(env_class):
    class Scored(EchoSuite):
        profile = {"agent": {"reply_format": "python"}, "rollout": {"split": "fit"}, "eval": {"split": "holdout"}}

        def env(self, task):
            return env_class("say yes", "yes")

        def expert(self):
            return Say()

    return Scored


PercentSuite, TypoSuite, NeverSuite, GoodSuite = map(suite_of, (Percent, Typo, Never, EchoEnv))
"""


@pytest.fixture
def scorers(user_pkg, monkeypatch):
    (user_pkg / "usertasks" / "scorers.py").write_text(SCORERS)
    monkeypatch.setattr(node, "_scorer_failure_said", False)  # a fresh command
    return "usertasks.scorers"


def rao(capsys, *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    ("suite", "message"),
    [
        ("TypoSuite", r"config error: task t\d \(small\): suite Typo \(usertasks\.scorers\.Typo\.success\) raised "
                      r"KeyError: 'wrod'"),
        ("PercentSuite", r"config error: the expert's tree of t\d \(Scored\), node t\d/0:0: suite Percent "
                         r"\(usertasks\.scorers\.Percent\.success\) returned 100\.0: a success must be a finite "
                         r"number in \[0, 1\]"),
    ],
)  # fmt: skip
def test_check_refuses_a_broken_scorer_in_one_line(scorers, tmp_path, capsys, suite, message):
    rc, err = rao(
        capsys, "train", "--check", "--set", f"suite={scorers}:{suite}", "--set", f"runs_dir={tmp_path}"
    )
    assert rc == 2 and re.fullmatch(message, err.strip()), err


def test_check_warns_when_the_expert_scores_zero_everywhere(scorers, tmp_path, capsys):
    rc, err = rao(
        capsys, "train", "--check", "--set", f"suite={scorers}:NeverSuite", "--set", f"runs_dir={tmp_path}"
    )
    assert rc == 0, err
    assert "warning: suite Scored: its expert's trees score 0 at every difficulty (small, big; the roots ended: " \
           "finished 2): is success() right" in err  # fmt: skip
    rc, err = rao(
        capsys, "train", "--check", "--set", f"suite={scorers}:GoodSuite", "--set", f"runs_dir={tmp_path}"
    )
    assert rc == 0 and "expert's trees score 0" not in err, err


def test_a_rollout_says_the_first_scorer_failure_and_stops_its_round(
    scorers, user_pkg, tmp_path, capsys, monkeypatch
):
    sets = [f"suite={scorers}:PercentSuite", f"runs_dir={tmp_path}", "policy.kind=scripted", "rollout.num_tasks=2",
            "rollout.group_size=2"]  # fmt: skip
    args = [a for s in sets for a in ("--set", s)]
    rc, err = rao(capsys, "rollout", "--no-progress", *args)
    said = [line for line in err.splitlines() if line.startswith("scorer error")]
    assert len(said) == 1 and re.fullmatch(
        r"scorer error, node t\d/\d:0: suite Percent \(usertasks\.scorers\.Percent\.success\) returned 100\.0: a "
        r"success must be a finite number in \[0, 1\] \(the node fails as infra_error\)",
        said[0],
    ), said
    assert rc == 1 and "WARNING: default: stopped: the suite's scorer failed at 4 of 4 nodes of round 0, as at " \
                       "node t" in err, err  # fmt: skip
    rollouts = tmp_path / "default" / "rollouts"
    assert not (rollouts / "round=0").exists() and len(list(rollouts.glob(".scorer-failed-round=0-*"))) == 1
    module = user_pkg / "usertasks" / "scorers.py"  # the fix; the same command samples the round again
    module.write_text(SCORERS.replace("return 100.0 *", "return 1.0 *"))
    monkeypatch.delitem(sys.modules, "usertasks.scorers")
    rc, err = rao(capsys, "rollout", "--no-progress", *args)
    assert rc == 0 and (rollouts / "round=0").is_dir(), err


def test_the_rounds_line_counts_the_scorers_failures_apart():
    def row(i: int, status: str, success: float, message: str = "") -> dict:
        return {"tree_id": f"t{i}", "node_id": f"t{i}:0", "depth": 0, "status": status, "success": success,
                "tree_status": "infra_error" if status == "infra_error" else "ok", "turns": 1, "children": 0,
                "started_at": 0.0, "ended_at": 1.0, "finish_message": message}  # fmt: skip

    rows = [row(0, "finished", 1.0), row(1, "finished", 0.0), row(2, "budget", 0.0), row(3, "loop", 0.0),
            row(4, "infra_error", 0.0, "scorer: suite x returned 7"), row(5, "infra_error", 0.0, "engine: gone")]  # fmt: skip
    s = summarize(pa.Table.from_pylist(rows, schema=NODE_SCHEMA))
    assert failure_counts(s) == (
        "policy failures 3 nodes (budget 1, finished below 1 1, loop 1), scorer failures 1 nodes, other "
        "infrastructure failures 1 nodes (trees left out of training: 2)"
    )


def test_the_one_rule_for_a_broken_scorer():
    """A scorer failure is an infra_error of kind `scorer:`; half the nodes or more is broken (the
    rule campaign.py stops on and the warm start refuses on)."""
    assert is_scorer_failure("infra_error", "scorer: suite x returned 7")
    assert not is_scorer_failure("infra_error", "engine: gone") and not is_scorer_failure(
        "finished", "scorer: x"
    )
    cases = [
        (0, 0, False),
        (0, 5, False),
        (1, 3, False),
        (2, 5, False),
        (1, 2, True),
        (3, 5, True),
        (4, 4, True),
    ]
    for failed, nodes, broken in cases:
        assert scorer_is_broken(failed, nodes) is broken, (failed, nodes)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return float(answer == str(task['anwser']))", "config error: task q\\d+ \\(\\w+\\): suite dataset's "
         "verifier v\\w+:check raised KeyError: 'anwser'"),
        ("return 100.0 * (answer == str(task['answer']))", "config error: task q\\d+ \\(\\w+\\): suite dataset's "
         "verifier v\\w+:check returned 100.0: a success must be a finite number in \\[0, 1\\]"),
        ("return float(answer == task['answer'])", "warning: suite DatasetSuite: right answers score below 1 at 6 "
         "of 6 tasks tried, e.g. q\\d+: finish\\('\\d+'\\) scored 0: is the verifier right\\?"),
    ],
)  # fmt: skip
def test_check_scores_a_dataset_verifier_on_the_rows_own_answers(
    tmp_path, monkeypatch, capsys, body, message
):
    data_rows(tmp_path)
    module = f"v{hashlib.sha256(body.encode()).hexdigest()[:8]}"  # a module per case: imports are cached
    (tmp_path / f"{module}.py").write_text(f"def check(answer, task):\n    {body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, err = rao(capsys, "train", "--check", "--set", "suite=dataset", "--set", f"suite_args.path={tmp_path}/q.parquet",
                  "--set", f"suite_args.verifier={module}:check", "--set", f"runs_dir={tmp_path}")  # fmt: skip
    assert re.search(message, err), err
    assert rc == (0 if message.startswith("warning") else 2)
    if rc == 0:  # the default model, no warm start: the shipped TextCraft policy, and the ways out
        assert "warning: policy.model: 'small-inline-7500' is a tiny TextCraft policy" in err
        assert "warmstart.demonstrator=module:function" in err and "on a GPU" in err
