"""One rollout tree: the root node, the budgets that span the tree, and the records of every node.

Children run as coroutines on the same event loop as everything else, so siblings launched with
`asyncio.gather` proceed concurrently and their engine requests batch together. The tree hands its
nodes a NodeContext (node.py) and collects their records; it also settles the success values that
need the whole tree: judge verdicts and the root proxy.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rao_core.agent.budget import TreeBudget
from rao_core.agent.executor import SandboxExecutors
from rao_core.agent.node import NodeContext, NodeRecord, run_node
from rao_core.agent.parsing import get_format
from rao_core.agent.prompts import ChatFraming
from rao_core.config import AgentConfig
from rao_core.envs.base import Environment, success_value
from rao_core.errors import InfrastructureError
from rao_core.policy import Policy
from rao_core.status import NodeStatus, TreeStatus
from rao_core.verdicts import Judge, error_verdict


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
        executors: SandboxExecutors,
        temperature: float = 1.0,
        judge: Judge | None = None,
        engine_attempts: int = 3,
    ) -> None:
        """`engine_attempts`: tries per generation request before the node ends as infra_error."""
        self.spec, self.tree_id, self.agent_cfg = spec, spec.tree_id, agent_cfg
        self.judge = judge
        self.judging: list[asyncio.Task] = []  # verdicts in flight, awaited when the root ends
        self.records: list[NodeRecord] = []
        self.status = TreeStatus.OK  # ok, timeout, or infra_error (the tree is then left out of training)
        self.infra_failures: list[tuple[str, str]] = []  # (kind, message) of each component failure
        self.seconds = 0.0
        self.budget = TreeBudget(agent_cfg.max_depth, agent_cfg.max_children, agent_cfg.max_nodes)
        self.context = NodeContext(
            tree_id=spec.tree_id, seed=spec.seed, policy=policy, chat=chat, fmt=get_format(agent_cfg.reply_format),
            agent=agent_cfg, temperature=temperature, engine_attempts=engine_attempts, budget=self.budget,
            executors=executors, on_record=self.node_ended, on_infra_failure=self.infra_failure,
        )  # fmt: skip

    def infra_failure(self, kind: str, message: str) -> None:
        """A component failed in this tree: its nodes' rewards say nothing about the policy."""
        self.infra_failures.append((kind, message))
        if self.status == TreeStatus.OK:
            self.status = TreeStatus.INFRA_ERROR

    def node_ended(self, rec: NodeRecord, judge_inputs: dict | None) -> None:
        self.records.append(rec)
        if judge_inputs is not None:
            self.judge_later(rec, judge_inputs)

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
            success_value(v.success, f"judge {self.judge.name}")  # the reward contract
        except Exception as e:  # the judge failed, not the node: the tree leaves training
            v = error_verdict(e, self.judge.name)
            kind = e.kind if isinstance(e, InfrastructureError) else "judge"
            self.infra_failure(kind, f"{kind}: {e}"[:500])
            rec.status = NodeStatus.INFRA_ERROR  # its answer stays; the verdict JSON holds the error
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
        root = asyncio.ensure_future(run_node(self.context, self.spec.env, "0", 0, None))
        try:
            await asyncio.wait_for(root, timeout=self.agent_cfg.tree_timeout_s)
        except TimeoutError:
            self.status = TreeStatus.TIMEOUT
        await self.settle_success()
        self.seconds = time.perf_counter() - start
        return sorted(self.records, key=lambda r: r.started_at)
