"""One rollout tree: the root node, its budgets, and the records of every node in it.

Children run as coroutines on the same event loop as everything else, so siblings launched with
`asyncio.gather` proceed concurrently and their engine requests batch together. Budgets that span
the tree (nodes per tree, wall-clock) live here; per-node budgets live in the node loop. So do the
success values that need the whole tree: judge verdicts and the root proxy (judge_later).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from dataclasses import dataclass

from rao_core.agent.node import NodeRecord, run_node
from rao_core.agent.parsing import get_format
from rao_core.agent.policy import Policy
from rao_core.agent.prompts import ChatFraming
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.base import Environment
from rao_core.errors import InfrastructureError
from rao_core.judges import Judge, error_verdict


@dataclass
class TreeSpec:
    """A root task instance: the g-th tree of a task."""

    task_id: str
    sample: int
    env: Environment
    difficulty: str = ""
    seed: int = 0

    @property
    def tree_id(self) -> str:
        return f"{self.task_id}/{self.sample}"


class TreeRun:
    def __init__(
        self,
        spec: TreeSpec,
        policy: Policy,
        chat: ChatFraming,
        agent_cfg: AgentConfig,
        sandbox_cfg: SandboxConfig,
        temperature: float = 1.0,
        judge: Judge | None = None,
        engine_attempts: int = 3,
    ) -> None:
        """`engine_attempts`: tries per generation request before the node ends as infra_error."""
        self.spec, self.policy, self.chat = spec, policy, chat
        self.engine_attempts = engine_attempts
        self.judge = judge
        self.judging: list[asyncio.Task] = []  # verdicts in flight, awaited when the root ends
        self.temperature = temperature
        self.agent_cfg, self.sandbox_cfg = agent_cfg, sandbox_cfg
        self.tree_id = spec.tree_id
        self.recursive = agent_cfg.mode == "recursive"
        self.fmt = get_format(agent_cfg.reply_format)
        self.records: list[NodeRecord] = []
        self.nodes_started = 1  # the root
        self.status = "ok"  # ok, timeout, or infra_error (the tree is then left out of training)
        self.infra_failures: list[tuple[str, str]] = []  # (kind, message) of each component failure
        self.seconds = 0.0

    def node_rng(self, path: str) -> random.Random:
        """A per-node generator that depends only on (seed, tree, node path): reruns are identical."""
        digest = hashlib.sha256(f"{self.spec.seed}|{self.tree_id}|{path}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "little"))

    def reserve_child(self, depth: int, children_so_far: int) -> str | None:
        """Reserve a node for a launch before it starts; returns a refusal message or None."""
        cfg = self.agent_cfg
        if depth + 1 > cfg.max_depth:
            return (
                f"Refused: sub-agents cannot go deeper than depth {cfg.max_depth}. "
                "Do this work yourself without launch_subagent."
            )
        if children_so_far >= cfg.max_children:
            return f"Refused: a node may start at most {cfg.max_children} sub-agents. Do the rest yourself."
        if self.nodes_started >= cfg.max_nodes:
            return f"Refused: the tree reached its limit of {cfg.max_nodes} agents. Do the rest yourself."
        self.nodes_started += 1
        return None

    def release_child(self) -> None:
        self.nodes_started -= 1

    def infra_failure(self, kind: str, message: str) -> None:
        """A component failed in this tree: its nodes' rewards say nothing about the policy."""
        self.infra_failures.append((kind, message))
        if self.status == "ok":
            self.status = "infra_error"

    def judge_later(self, rec: NodeRecord, inputs: dict) -> None:
        """Score a node that has no exact verifier (its env returned judge_inputs). With a judge,
        the verdict runs as its own task, awaited at the end of the tree: a parent never waits on
        its child's judge, and a tree timeout never cancels a verdict. Without one, a node whose
        goal the suite could read back into an exact reference keeps env.success() (a verifier);
        any other takes the root's final success: the proxy of rao-method.md section 2."""
        if self.judge is None:
            rec.success_source = "verifier" if inputs.get("reference") is not None else "root_proxy"
            return
        rec.success, rec.success_source = 0.0, "judge"
        self.judging.append(asyncio.ensure_future(self._judge_node(rec, inputs)))

    async def _judge_node(self, rec: NodeRecord, inputs: dict) -> None:
        assert self.judge is not None
        try:
            v = await self.judge.judge(inputs["goal"], inputs["answer"], inputs.get("reference"))
        except Exception as e:  # the judge failed, not the node: the tree leaves training
            v = error_verdict(e, self.judge.name)
            kind = e.kind if isinstance(e, InfrastructureError) else "judge"
            self.infra_failure(kind, f"{kind}: {e}"[:500])
        rec.success, rec.judge_verdict = v.success, v.verdict

    async def settle_success(self) -> None:
        """After the root has ended: wait for pending verdicts, then give root_proxy nodes the
        root's success (the root keeps its own env.success() when it is a proxy itself)."""
        if self.judging:
            await asyncio.shield(asyncio.gather(*self.judging))
        root = next((r for r in self.records if r.parent_id is None), None)
        for r in self.records:
            if root is not None and r is not root and r.success_source == "root_proxy":
                r.success = root.success

    async def run(self) -> list[NodeRecord]:
        start = time.perf_counter()
        root = asyncio.ensure_future(run_node(self, self.spec.env, "0", 0, None))
        try:
            await asyncio.wait_for(root, timeout=self.agent_cfg.tree_timeout_s)
        except TimeoutError:
            self.status = "timeout"
        await self.settle_success()
        self.seconds = time.perf_counter() - start
        return sorted(self.records, key=lambda r: r.started_at)
