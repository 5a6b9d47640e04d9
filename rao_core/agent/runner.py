"""The one tree runner: many trees on this event loop, a bounded number at a time. The rollout, the
evaluation, the warm start's expert data and the benchmarks all run their trees through it, and it
owns what the trees start: their REPL workers end with it, whatever happened."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rao_core.agent.executor import SandboxExecutors
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.policy import Policy
from rao_core.verdicts import Judge


async def run_trees(
    specs: list[TreeSpec],
    policy: Policy,
    chat: ChatFraming,
    agent: AgentConfig | Callable[[TreeSpec], AgentConfig],
    sandbox: SandboxConfig,
    temperature: float = 1.0,
    concurrency: int = 16,
    judge: Judge | None = None,
    engine_attempts: int = 3,
    on_tree_done: Callable[[TreeRun], None] | None = None,
) -> list[TreeRun]:
    """Run every tree, at most `concurrency` at a time, and return them in the order of `specs`.
    `agent` is the agent's settings, or a function giving each tree its own (the warm start mixes
    recursive and flat trees); `judge` scores the nodes whose suite has no exact verifier."""
    gate = asyncio.Semaphore(concurrency)
    executors = SandboxExecutors(sandbox)

    async def one(spec: TreeSpec) -> TreeRun:
        async with gate:
            cfg = agent(spec) if callable(agent) else agent
            run = TreeRun(spec, policy, chat, cfg, executors, temperature, judge, engine_attempts)
            await run.run()
        if on_tree_done:
            on_tree_done(run)
        return run

    try:
        return list(await asyncio.gather(*(one(s) for s in specs)))
    finally:
        await executors.close()
