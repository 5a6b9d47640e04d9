"""Failures of the machine are not the policy's: each kind is injected into a real tree, retried,
then recorded as `infra_error`, and no node of an affected tree is trained. Failures the policy
causes (a cell that crashes its REPL, a loop) stay policy failures and are trained on."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
import torch

from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import AgentConfig, SandboxConfig, ScoringConfig
from rao_core.engines.hf import HFEngine
from rao_core.engines.openai import OpenAIEngine
from rao_core.engines.server import start_background
from rao_core.eval.metrics import summarize
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.policy import Generation, GenerationRequest, Policy
from rao_core.sampler import tree_rows
from rao_core.scoring import score_round, scores_summary
from rao_core.store.parquet import read_partition, write_partition
from rao_core.store.schema import NODE_SCHEMA
from tests.agent.test_runtime import CHAT, NoteEnv
from tests.agent.test_sandbox import OS
from tests.conftest import CellScript, row_labels
from tests.engines import small_model

AGENT = AgentConfig(cell_timeout_s=5.0, tree_timeout_s=60.0, reply_format="thought_python", max_steps=3,
                    max_context_tokens=8192)  # fmt: skip


def delegate(node) -> str:
    """The root delegates once, then finishes; the child finishes at once."""
    if node.depth == 1:
        return "finish('ok')"
    return "print(await launch_subagent('say ok'))" if node.turn == 0 else "finish('ok')"


class FailingPolicy(Policy):
    """Wraps a policy; raises `error` on the nodes `fails(node)` picks, `times` times each (None: always)."""

    def __init__(self, inner: Policy, fails, error: Exception, times: int | None = None) -> None:
        self.inner, self.fails, self.error, self.times = inner, fails, error, times
        self.raised: dict[str, int] = {}

    async def generate(self, request: GenerationRequest) -> Generation:
        node = request.node
        n = self.raised.get(node.node_id, 0)
        if self.fails(node) and (self.times is None or n < self.times):
            self.raised[node.node_id] = n + 1
            raise self.error
        return await self.inner.generate(request)


def run(policy: Policy, env=None, attempts: int = 2) -> TreeRun:
    spec = TreeSpec("t", 0, env or NoteEnv("say ok"))
    (tree,) = asyncio.run(run_trees([spec], policy, CHAT, AGENT, SandboxConfig(), engine_attempts=attempts))
    return tree


def statuses(tree: TreeRun) -> dict[int, str]:
    return {r.depth: r.status for r in tree.records}


def test_engine_failure_after_retries_is_infra_error():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    policy = FailingPolicy(CellScript(delegate), lambda n: n.depth == 1, oom)
    tree = run(policy, attempts=3)
    assert policy.raised == {"t/0:0.1": 3}  # tried three times, then given up
    child = next(r for r in tree.records if r.depth == 1)
    assert child.status == "infra_error" and child.finish_message.startswith("engine: OutOfMemoryError")
    assert statuses(tree)[0] == "finished"  # the parent saw a failed sub-agent and carried on
    assert tree.status == "infra_error" and tree.infra_failures[0][0] == "engine"


def test_a_transient_engine_failure_is_retried_away():
    policy = FailingPolicy(CellScript(delegate), lambda n: n.depth == 1, RuntimeError("reset"), times=1)
    tree = run(policy, attempts=2)
    assert policy.raised == {"t/0:0.1": 1}
    assert statuses(tree) == {0: "finished", 1: "finished"} and tree.status == "ok"


class BrokenEngine(HFEngine):
    """A real batching engine whose forward pass runs out of memory."""

    def _forward(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")


def test_http_5xx_and_a_server_that_is_gone():
    tok = tiny_tokenizer()
    url, stop = start_background(BrokenEngine(small_model(tok), tok))  # answers HTTP 500
    try:
        tree = run(OpenAIEngine(url, "tiny", tok), attempts=2)
    finally:
        stop()
    root = tree.records[0]
    assert root.status == "infra_error" and "HTTP 500" in root.finish_message
    gone = run(OpenAIEngine(url, "tiny", tok), attempts=2)  # the server was stopped
    assert gone.records[0].status == "infra_error" and "ConnectError" in gone.records[0].finish_message
    assert tree.status == gone.status == "infra_error"


class UnstartableEnv(NoteEnv):
    """Asks for a REPL variable the worker refuses: the sandbox cannot start."""

    def repl_variables(self) -> dict:
        return {"not a name": 1}


class BrokenScorerEnv(NoteEnv):
    def success(self, finished: bool, finish_message: str) -> float:
        raise KeyError("verifier lost its reference")


def test_sandbox_and_scorer_failures_are_infra_errors():
    tree = run(CellScript(lambda n: "finish('ok')"), UnstartableEnv("say ok"))
    assert tree.records[0].status == "infra_error" and tree.records[0].finish_message.startswith("sandbox:")
    assert tree.records[0].turns == 0 and tree.status == "infra_error"
    tree = run(CellScript(lambda n: "finish('ok')"), BrokenScorerEnv("say ok"))
    assert tree.records[0].status == "infra_error" and tree.records[0].finish_message.startswith("scorer:")


def test_policy_failures_stay_policy_failures():
    crash = run(CellScript(lambda n: OS + "os._exit(3)"))  # the cell kills its own REPL
    assert crash.records[0].status == "error" and crash.status == "ok"
    loop = run(CellScript(lambda n: "print(1)"), attempts=1)
    assert loop.records[0].status in ("budget", "loop") and loop.status == "ok"


def test_no_node_of_an_affected_tree_is_trained(toy):
    """Two tasks x 3 trees; in each task one tree's child meets a dead engine. The scored round
    drops exactly those trees ('infra_error'), trains the others, and counts them."""
    cfg = toy("rollout.group_size=3")
    fails = lambda n: n.depth == 1 and n.node_id.split(":")[0].endswith("/1")  # noqa: E731
    script = CellScript(delegate)
    policy = FailingPolicy(script, fails, ConnectionError("engine gone"))
    specs = [TreeSpec(task, g, NoteEnv("say ok"), "easy") for task in ("a", "b") for g in range(3)]
    runs = asyncio.run(
        run_trees(specs, policy, CHAT, cfg.agent, cfg.sandbox, engine_attempts=cfg.policy.retries)
    )
    rows = [row for r in runs for row in tree_rows(r, row_labels(cfg))]
    table = pa.Table.from_pylist(rows, schema=NODE_SCHEMA)
    write_partition({"nodes": table}, cfg.run_dir / "rollouts" / "round=0")
    score_round(cfg.run_dir, 0, ScoringConfig(zero_advantage_groups="keep"))
    scores = read_partition(cfg.run_dir / "scores" / "round=0", "scores").to_pylist()
    affected = {s["tree_id"] for s in scores if s["tree_id"].endswith("/1")}
    assert affected == {"a/1", "b/1"}
    for s in scores:
        if s["tree_id"] in affected:
            assert not s["trained"] and s["drop_reason"] == "infra_error" and s["weighted_advantage"] == 0
        else:
            assert s["trained"] and s["drop_reason"] is None
    assert summarize(table)["infra_failed_trees"] == 2 and summarize(table)["infra_failed_nodes"] == 2
    assert scores_summary(cfg.run_dir, 0)["dropped_trees"] == {"infra_error": 2}


@pytest.mark.parametrize("kind", ["engine", "sandbox"])
def test_infra_nodes_keep_their_rows(kind):
    """The failed node is still stored (tokens so far, the reason), never silently lost."""
    if kind == "engine":
        tree = run(FailingPolicy(CellScript(delegate), lambda n: True, RuntimeError("boom")), attempts=1)
    else:
        tree = run(CellScript(delegate), UnstartableEnv("say ok"))
    (root,) = tree.records
    assert root.token_ids and len(root.action_mask) == len(root.token_ids) and root.ended_at > 0


def test_a_bug_raises_instead_of_becoming_a_statistic(monkeypatch):
    """Only a component's failure ends a node as infra_error. A bug in the runtime itself (here in
    the reply parser of a child node) raises out of the rollout, loudly, rather than being counted."""
    import rao_core.agent.node as node

    real = node.parse_reply

    def buggy(text, fmt):  # the child's first reply (the root's cell is waiting on it)
        if "finish('ok')" in text:
            raise ZeroDivisionError("a bug in the runtime")
        return real(text, fmt)

    monkeypatch.setattr(node, "parse_reply", buggy)
    with pytest.raises(ZeroDivisionError, match="a bug in the runtime"):
        run(CellScript(delegate))
