"""One reward contract on every route: a suite's success(), a dataset's verifier and a judge must give
a finite number in [0, 1]. 1.7, -0.1, NaN, a string or an exception fails that node as an
infrastructure failure naming the scorer and the value; the tree leaves training, the run goes on,
and the round's summary counts the nodes."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pyarrow as pa
import pytest

from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.base import success_value
from rao_core.eval.metrics import summarize
from rao_core.sampler import tree_rows
from rao_core.store.schema import NODE_SCHEMA
from rao_core.verdicts import Judge, Verdict
from tests.agent.test_judges import JudgedNoteEnv, judged_tree, script
from tests.agent.test_runtime import CHAT, NoteEnv
from tests.conftest import CellScript, row_labels

BAD = [1.7, -0.1, math.nan, "1", RuntimeError("scorer crashed")]
GOOD = [(True, 1.0), (0, 0.0), (0.5, 0.5), (np.float32(0.25), 0.25), (np.int64(1), 1.0)]


def test_the_contract_itself():
    for value, expected in GOOD:
        assert success_value(value, "x") == expected and type(success_value(value, "x")) is float
    for value in [1.7, -0.1, math.nan, math.inf, "1", None, [1.0], 1 + 0j]:
        with pytest.raises(ValueError, match=r"x returned .*: a success must be a finite number in \[0, 1\]"):
            success_value(value, "x")


class ScoredEnv(NoteEnv):
    """A root that finishes at once and scores whatever it was given (or raises it)."""

    suite = "scored"

    def __init__(self, goal: str, value=1.0) -> None:
        super().__init__(goal)
        self.value = value

    def success(self, finished: bool, finish_message: str):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def finish_at_once(node) -> str:
    return "finish('say ok')"


def run_roots(envs) -> list:
    cfg = AgentConfig(cell_timeout_s=5.0, tree_timeout_s=60.0, reply_format="thought_python", max_steps=3)
    specs = [TreeSpec("t", i, env) for i, env in enumerate(envs)]
    return asyncio.run(run_trees(specs, CellScript(finish_at_once), CHAT, cfg, SandboxConfig(), 1.0))


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_a_suite_success_outside_the_contract_fails_its_node(value):
    good, bad = run_roots([ScoredEnv("say ok", 1.0), ScoredEnv("say ok", value)])
    assert good.status.value == "ok" and good.records[0].success == 1.0  # the run goes on
    (rec,) = bad.records
    assert rec.status == "infra_error" and rec.success == 0.0 and bad.status.value == "infra_error"
    assert "suite scored" in rec.finish_message and "ScoredEnv.success" in rec.finish_message
    shown = "crashed" if isinstance(value, Exception) else repr(value)
    assert shown in rec.finish_message
    rows = [r for t in (good, bad) for r in tree_rows(t, row_labels(_rows_cfg()))]
    s = summarize(pa.Table.from_pylist(rows, schema=NODE_SCHEMA))
    assert (s["infra_failed_nodes"], s["scorer_failed_nodes"], s["infra_failed_trees"]) == (1, 1, 1)


def _rows_cfg():
    from rao_core.run import load_config

    return load_config(None, ["policy.kind=scripted"])


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_a_dataset_verifier_outside_the_contract_fails_its_node(tmp_path, monkeypatch, value):
    from tests.envs.test_dataset_suite import config, data_rows
    from tests.envs.test_dataset_suite import run_roots as run_dataset_roots

    data_rows(tmp_path)
    body = "raise RuntimeError('scorer crashed')" if isinstance(value, Exception) else f"return {value!r}"
    module = f"badverify{BAD.index(value)}"  # a module per case: imports are cached
    source = f"import math\nnan = math.nan\ndef bad(answer, task):\n    {body}\n"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = config(tmp_path, f"suite_args.verifier={module}:bad", "rollout.num_tasks=2")
    _, roots = run_dataset_roots(cfg)
    assert roots and all(r.status == "infra_error" and r.success == 0.0 for r in roots)
    assert all(f"suite dataset's verifier {module}:bad" in r.finish_message for r in roots)
    why = "raised RuntimeError: scorer crashed" if isinstance(value, Exception) else f"returned {value!r}"
    assert all(why in r.finish_message for r in roots), roots[0].finish_message


class BadJudge(Judge):
    """A judge of one's own whose verdicts break the contract."""

    def __init__(self, value) -> None:
        super().__init__("bad-judge")
        self.value = value

    async def reply(self, goal, answer, reference) -> str:
        raise AssertionError("judge() is overridden")

    async def judge(self, goal, answer, reference=None) -> Verdict:
        if isinstance(self.value, Exception):
            raise self.value
        return Verdict(self.value, '{"success": true}')


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_a_judge_outside_the_contract_fails_its_node(value):
    nodes = judged_tree(BadJudge(value), CellScript(script), env=JudgedNoteEnv)
    judged = [nodes["part 0"], nodes["part 1"]]
    assert all(n.status == "infra_error" and n.success == 0.0 for n in judged)
    assert nodes["say ok"].status == "finished"  # the root's own verifier still scored it
    assert nodes["tree"].status.value == "infra_error"
    assert all("judge" in kind for kind, _ in nodes["tree"].infra_failures)
