"""A dataset's demonstrator (warmstart.demonstrator): a function of a task row that returns the cells a
node writes, sub-agents included, turned into demonstration trees with the run's tokenizer and chat
framing and kept where they succeed; `--check` runs one per difficulty and refuses one that breaks."""

from __future__ import annotations

import pytest

from flows.cli import main
from rao_core.envs.demonstrator import as_cells
from rao_core.envs.suites import open_suite
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.train.demonstrations import expert_examples
from tests.envs.test_dataset_suite import config, data_rows

DEMOS = """
def solve(task):
    text = "context" if task["context"] is not None else repr(task["goal"].split("? ")[1])
    if task["depth"] == 0 and task["recursive"] and task["difficulty"] == "long" and task["context"]:
        goal = task["goal"]
        return ["h = len(context) // 2",
                f"a = await launch_subagent({goal!r}, context=context[:h])\\nb = await launch_subagent({goal!r}, context=context[h:])",
                "finish(str(int(a) + int(b)))"]
    return [f"finish(str(len({text})))"]

def raises(task):
    return task["anwser"]

def wrong(task):
    return ["finish('0')"]

def shapeless(task):
    return 42
"""


@pytest.fixture
def data(tmp_path, monkeypatch):
    data_rows(tmp_path)
    (tmp_path / "demos.py").write_text(DEMOS)
    (tmp_path / "verify.py").write_text(
        "def exact(answer, task):\n    return float(answer == str(task['answer']))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_cells_are_strings_or_thought_code_pairs():
    assert as_cells(None, "f") == [] and as_cells("print(1)", "f") == [("", "print(1)")]
    assert as_cells(["a = 1", ("why", "finish(a)")], "f") == [("", "a = 1"), ("why", "finish(a)")]
    with pytest.raises(TypeError, match=r"^warmstart.demonstrator f returned 42: expected a list of cells"):
        as_cells(42, "f")


def test_the_demonstrators_trees_are_the_warm_starts_data(data):
    """Roots and their sub-agents (each asked with its own goal and context) make the trees; the
    nodes that succeed are examples in the run's tokenizer, their own cells the only trained tokens."""
    cfg = config(data, "suite_args.verifier=verify:exact", "policy.model=warmstart",
                 "warmstart.demonstrator=demos:solve", "warmstart.recursive_episodes=6",
                 "warmstart.flat_episodes=2", "agent.max_new_tokens=96")  # fmt: skip
    tok = tiny_tokenizer()
    from rao_core.agent.prompts import ChatFraming

    rows, trees = expert_examples(cfg.warmstart, ChatFraming(tok), open_suite(cfg))
    assert trees["made"] == 8 and trees["kept"] == 8 and trees["dropped"] == 0
    assert {r["mode"] for r in rows} == {"recursive", "flat"} and any(r["depth"] == 1 for r in rows)
    actions = [
        tok.decode([t for t, m in zip(r["input_ids"], r["assistant_masks"], strict=True) if m]) for r in rows
    ]
    assert all(a.startswith("<python>\n") for a in actions) and any("launch_subagent" in a for a in actions)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raises", "config error: the expert's tree of q\\d+ \\(DatasetSuite\\), node q\\d+/0:0: the expert raised KeyError: 'anwser'"),
        ("shapeless", "config error: the expert's tree of q\\d+ \\(DatasetSuite\\), node q\\d+/0:0: the expert raised TypeError: "
                      "warmstart.demonstrator demos:shapeless returned 42"),
        ("wrong", "warning: suite DatasetSuite: its expert's trees score 0 at every difficulty \\(short, long; the roots "
                  "ended: finished 2\\)"),
        ("nothere", "config error: warmstart.demonstrator: 'demos:nothere': module demos has no nothere"),
    ],
)  # fmt: skip
def test_check_runs_the_demonstrator_once_per_difficulty(data, capsys, name, message):
    import re

    sets = [f"runs_dir={data}", "suite=dataset", f"suite_args.path={data / 'q.parquet'}", "suite_args.verifier=verify:exact",
            "policy.model=warmstart", f"warmstart.demonstrator=demos:{name}", "agent.max_new_tokens=96"]  # fmt: skip
    rc = main(["train", "--check", *(a for s in sets for a in ("--set", s))])
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert rc == (0 if message.startswith("warning") else 2)


def test_a_dataset_without_a_demonstrator_cannot_warm_start(data, capsys):
    sets = [f"runs_dir={data}", "suite=dataset", f"suite_args.path={data / 'q.parquet'}",
            "suite_args.verifier=verify:exact", "policy.model=warmstart"]  # fmt: skip
    assert main(["train", "--check", *(a for s in sets for a in ("--set", s))]) == 2
    assert "or warmstart.demonstrator (a function of yours) or write expert()" in capsys.readouterr().err
