"""One rollout tree: the root node, its budgets, and the records of every node in it.

Children run as coroutines on the same event loop as everything else, so siblings launched with
`asyncio.gather` proceed concurrently and their engine requests batch together. Budgets that span
the tree (nodes per tree, wall-clock) live here; per-node budgets live in the node loop.
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
    ) -> None:
        self.spec, self.policy, self.chat = spec, policy, chat
        self.temperature = temperature
        self.agent_cfg, self.sandbox_cfg = agent_cfg, sandbox_cfg
        self.tree_id = spec.tree_id
        self.recursive = agent_cfg.mode == "recursive"
        self.fmt = get_format(agent_cfg.reply_format)
        self.records: list[NodeRecord] = []
        self.nodes_started = 1  # the root
        self.status = "ok"
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

    async def run(self) -> list[NodeRecord]:
        start = time.perf_counter()
        root = asyncio.ensure_future(run_node(self, self.spec.env, "0", 0, None))
        try:
            await asyncio.wait_for(root, timeout=self.agent_cfg.tree_timeout_s)
        except TimeoutError:
            self.status = "timeout"
        self.seconds = time.perf_counter() - start
        return sorted(self.records, key=lambda r: r.started_at)
