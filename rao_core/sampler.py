"""The Sampler: the only way trees run. A rollout round, an evaluation (the control arm's too), the
warm start's expert data and its evaluation, and the benches all draw trees and hand them to a
Sampler, which runs them through the agent runtime with one policy (an engine or a scripted expert),
one chat framing, the agent's budgets, the sandbox and a judge, and turns them into node rows of
the one schema.

    draw    which tasks of which split, G trees each, seeded (Draw, draw_trees)
    sample  every tree on one event loop, a bounded number at a time (Sampler.run)
    rows    one row per node (NODE_SCHEMA), written as one atomic partition (write_rows)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from rao_core.agent.prompts import ChatFraming
from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.base import select_tasks
from rao_core.interrupts import run_async
from rao_core.policy import Policy
from rao_core.store.parquet import write_partition
from rao_core.store.schema import NODE_SCHEMA
from rao_core.verdicts import Judge

T = TypeVar("T")


# -- draws -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Draw:
    """Which trees run: `num_tasks` tasks of `split` (per difficulty, or over the mix), drawn with
    `task_seed`, `group_size` trees each, sampled at `temperature` with the trees' `tree_seed`;
    with `shard = (k, n)` only the k-th of n deals of those tasks."""

    split: str
    difficulties: tuple[str, ...]
    num_tasks: int
    group_size: int
    temperature: float
    task_seed: int
    tree_seed: int
    per_difficulty: bool = False
    shard: tuple[int, int] = (0, 1)


def tree_seed(seed: int, index: int) -> int:
    """The trees' seed of round (or evaluated version) `index` under rollout.seed `seed`: every
    sampling request and scripted choice derives from it, the tree and the node
    (rao_core.agent.node.request_seed), so a round reruns token for token."""
    return seed * 1_000_003 + index


def shard_tasks(tasks: Sequence[T], shards: int) -> list[list[T]]:
    """Deal root tasks round-robin into `shards` lists. Deterministic (the task draw is seeded),
    every tree of a task lands in the same shard (its group baseline stays whole), and a
    difficulty mix is spread evenly."""
    return [list(tasks[k::shards]) for k in range(shards)]


def draw_trees(suite, draw: Draw) -> list[TreeSpec]:
    """The draw's tree specs, seeded: the same draw always gives the same trees."""
    pool = suite.tasks(draw.split)
    groups = [[d] for d in draw.difficulties] if draw.per_difficulty else [list(draw.difficulties)]
    tasks = [
        t for g in groups for t in select_tasks(pool, draw.split, g, draw.num_tasks, seed=draw.task_seed)
    ]
    if not tasks:
        raise ValueError(
            f"rollout.difficulty: no {draw.split} tasks of difficulty {','.join(draw.difficulties)!r} in this world"
        )
    tasks = shard_tasks(tasks, draw.shard[1])[draw.shard[0]]
    return [
        TreeSpec(t.task_id, g, suite.env(t), t.difficulty, seed=draw.tree_seed)
        for t in tasks
        for g in range(draw.group_size)
    ]


# -- rows --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowLabels:
    """What every row of a partition says about where it comes from."""

    run: str
    round: int
    split: str
    mode: str
    suite: str
    policy_version: int


def tree_rows(run: TreeRun, labels: RowLabels) -> list[dict]:
    """One row per node of a tree, in the nodes schema (rao_core/store/schema.py)."""
    rows = []
    for r in run.records:
        n_action = sum(r.action_mask)
        rows.append(
            {
                "run": labels.run,
                "round": labels.round,
                "split": labels.split,
                "mode": labels.mode,
                "suite": labels.suite,
                "task_id": run.spec.task_id,
                "sample": run.spec.sample,
                "tree_id": run.tree_id,
                "node_id": r.node_id,
                "parent_id": r.parent_id,
                "depth": r.depth,
                "policy_version": labels.policy_version,
                "goal": r.goal,
                "targets": r.targets,
                "difficulty": run.spec.difficulty,
                "context_chars": r.context_chars,
                "status": r.status,
                "finish_message": r.finish_message,
                "success": r.success,
                "success_source": r.success_source,
                "temperature": r.temperature,
                "judge_verdict": r.judge_verdict,
                "tree_status": run.status,
                "turns": r.turns,
                "children": r.children,
                "refused_launches": r.refused_launches,
                "prompt_tokens": len(r.token_ids) - n_action,
                "action_tokens": n_action,
                "started_at": r.started_at,
                "ended_at": r.ended_at,
                "token_ids": r.token_ids,
                "action_mask": r.action_mask,
                "logprobs": r.logprobs,
                "transcript": r.transcript,
            }
        )
    return rows


def write_rows(runs: list[TreeRun], labels: RowLabels, dest: Path, meta: dict[str, Any]) -> Path:
    """The trees' rows as the partition `dest` (atomic; a partition another attempt completed first
    is kept as it is)."""
    table = pa.Table.from_pylist([row for run in runs for row in tree_rows(run, labels)], schema=NODE_SCHEMA)
    try:
        return write_partition({"nodes": table}, dest, meta=meta)
    except FileExistsError:  # a presumed-lost attempt of this shard finished first: keep its rows
        return dest


# -- the sampler -------------------------------------------------------------------------------
@dataclass
class Sampler:
    """Runs trees: `agent` is the agent's settings, or a function giving each tree its own (the
    warm start mixes recursive and flat trees); `judge` scores the nodes a suite cannot verify."""

    policy: Policy
    chat: ChatFraming
    agent: AgentConfig | Callable[[TreeSpec], AgentConfig]
    sandbox: SandboxConfig
    judge: Judge | None = None
    temperature: float = 1.0
    concurrency: int = 16
    retries: int = 3

    def run(
        self, specs: list[TreeSpec], label: str = "", on_tree_done: Callable[[TreeRun], None] | None = None
    ) -> list[TreeRun]:
        """Every tree, in the order of `specs`; the policy and the judge are closed after. With a
        `label`, a progress bar of trees done."""
        if not label:
            return run_async(self._run(specs, on_tree_done))
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress(f"[bold]{label}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
            task = bar.add_task("trees", total=len(specs))

            def done(run: TreeRun) -> None:
                bar.advance(task)
                if on_tree_done:
                    on_tree_done(run)

            return run_async(self._run(specs, done))

    async def _run(self, specs: list[TreeSpec], on_tree_done) -> list[TreeRun]:
        try:
            return await run_trees(
                specs, self.policy, self.chat, self.agent, self.sandbox, self.temperature,
                self.concurrency, self.judge, self.retries, on_tree_done,
            )  # fmt: skip
        finally:
            await self.policy.close()
            if self.judge is not None:
                await self.judge.close()

    def sample(self, specs: list[TreeSpec], labels: RowLabels, dest: Path, meta: dict[str, Any],
               progress: bool = False, on_tree_done: Callable[[TreeRun], None] | None = None) -> Path:  # fmt: skip
        """Run the trees and write their rows as the partition `dest`, with the wall time in `meta`."""
        start = time.time()
        runs = self.run(specs, dest.parent.name if progress else "", on_tree_done)
        return write_rows(
            runs, labels, dest, {"trees": len(runs), "seconds": round(time.time() - start, 3), **meta}
        )
