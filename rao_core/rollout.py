"""The rollout stage: G trees for each of N root tasks, written as one atomic Parquet partition.

synthesize (if the run has no data yet) -> select tasks -> run all trees concurrently on one
event loop -> rows (one per node) -> runs/<run>/rollouts/round=N/nodes.parquet
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from rao_core.agent.policy import Policy
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.sandbox import shutdown_sandboxes
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import RunConfig, save_config
from rao_core.envs.suites import open_suite
from rao_core.envs.textcraft.tasks import select_tasks
from rao_core.models.tokenizer import load_tokenizer
from rao_core.store.parquet import clean_temporaries, is_complete, read_partition, write_partition
from rao_core.store.schema import NODE_SCHEMA


def rollout_dir(cfg: RunConfig, round_: int) -> Path:
    return cfg.run_dir / "rollouts" / f"round={round_}"


def make_policy(cfg: RunConfig, suite, model_path: Path | None = None) -> tuple[Policy, Any]:
    """The suite's scripted expert, or a model engine serving `model_path` (default policy.model);
    returned with the tokenizer that frames the conversation (the checkpoint's own for models)."""
    if cfg.policy.kind == "scripted":
        return suite.expert(cfg), load_tokenizer(cfg.policy.tokenizer)
    from rao_core.campaign import initial_model
    from rao_core.engines import build_engine

    path = model_path or initial_model(cfg)  # shipped name, local folder, or 'tiny'
    tokenizer = load_tokenizer(str(path))
    return build_engine(dataclasses.replace(cfg.policy, model=str(path)), tokenizer), tokenizer


async def run_trees(
    specs: list[TreeSpec],
    policy: Policy,
    chat: ChatFraming,
    cfg: RunConfig,
    temperature: float,
    on_tree_done: Callable[[TreeRun], None] | None = None,
) -> list[TreeRun]:
    """Run every tree on this event loop, at most `max_concurrent_trees` at a time."""
    gate = asyncio.Semaphore(cfg.rollout.max_concurrent_trees)

    async def one(spec: TreeSpec) -> TreeRun:
        async with gate:
            run = TreeRun(spec, policy, chat, cfg.agent, cfg.sandbox, temperature)
            await run.run()
        if on_tree_done:
            on_tree_done(run)
        return run

    return list(await asyncio.gather(*(one(s) for s in specs)))


def tree_rows(run: TreeRun, cfg: RunConfig, split: str) -> list[dict]:
    rows = []
    for r in run.records:
        n_action = sum(r.action_mask)
        rows.append(
            {
                "run": cfg.run_name,
                "round": cfg.rollout.round,
                "split": split,
                "mode": cfg.agent.mode,
                "suite": cfg.suite,
                "task_id": run.spec.task_id,
                "sample": run.spec.sample,
                "tree_id": run.tree_id,
                "node_id": r.node_id,
                "parent_id": r.parent_id,
                "depth": r.depth,
                "policy_version": cfg.rollout.policy_version,
                "goal": r.goal,
                "targets": r.targets,
                "difficulty": run.spec.difficulty,
                "context_chars": r.context_chars,
                "status": r.status,
                "finish_message": r.finish_message,
                "success": r.success,
                "success_source": "verifier",
                "judge_verdict": None,
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


def rollout_round(cfg: RunConfig, progress: bool = False, model_path: Path | None = None) -> Path:
    """Roll out one training round; a round whose partition is already complete is not run again."""
    r = cfg.rollout
    return run_rollout(
        cfg, rollout_dir(cfg, r.round), r.split, r.difficulty, r.num_tasks, r.group_size,
        cfg.policy.temperature, progress, model_path,
    )  # fmt: skip


def run_rollout(
    cfg: RunConfig,
    dest: Path,
    split: str,
    difficulty: str,
    num_tasks: int,
    group_size: int,
    temperature: float,
    progress: bool = False,
    model_path: Path | None = None,
    per_difficulty: bool = False,
) -> Path:
    """G trees for each of N tasks of a split (N per difficulty with `per_difficulty`), written as
    the partition `dest` (idempotent)."""
    if is_complete(dest):
        return dest
    clean_temporaries(dest.parent)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cfg.run_dir / "config.yaml")
    suite = open_suite(cfg)
    difficulties = [d.strip() for d in difficulty.split(",")]
    seed = cfg.tasks.seed + cfg.rollout.round
    pool = suite.tasks(split)
    groups = [[d] for d in difficulties] if per_difficulty else [difficulties]
    tasks = [t for g in groups for t in select_tasks(pool, split, g, num_tasks, seed=seed)]
    if not tasks:
        raise ValueError(f"rollout.difficulty: no {split} tasks of difficulty {difficulty!r} in this world")
    specs = [
        TreeSpec(t.task_id, g, suite.env(t), t.difficulty, seed=cfg.rollout.round)
        for t in tasks
        for g in range(group_size)
    ]
    policy, tokenizer = make_policy(cfg, suite, model_path)
    chat = ChatFraming(tokenizer)

    async def main(on_tree_done: Callable[[TreeRun], None] | None) -> list[TreeRun]:
        try:
            return await run_trees(specs, policy, chat, cfg, temperature, on_tree_done)
        finally:
            await policy.close()
            await shutdown_sandboxes()  # leave no worker behind, whatever happened

    start = time.time()
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress(
            f"[bold]{dest.parent.name}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        ) as bar:
            task = bar.add_task("trees", total=len(specs))
            runs = asyncio.run(main(lambda _: bar.advance(task)))
    else:
        runs = asyncio.run(main(None))
    rows = [row for run in runs for row in tree_rows(run, cfg, split)]
    table = pa.Table.from_pylist(rows, schema=NODE_SCHEMA)
    meta = {"trees": len(runs), "seconds": round(time.time() - start, 3)}
    return write_partition({"nodes": table}, dest, meta=meta)


def summarize(table: pa.Table) -> dict:
    """Headline figures of one rollout partition, for the CLI and for tracking."""
    rows = table.select(
        ["tree_id", "depth", "status", "success", "turns", "children", "started_at", "ended_at"]
    ).to_pylist()
    roots = [r for r in rows if r["depth"] == 0]
    by_depth: dict[int, list[float]] = {}
    for r in rows:
        by_depth.setdefault(r["depth"], []).append(r["success"])
    span = max(r["ended_at"] for r in rows) - min(r["started_at"] for r in rows) if rows else 0.0
    return {
        "trees": len(roots),
        "nodes": len(rows),
        "root_success": sum(r["success"] for r in roots) / max(1, len(roots)),
        "nodes_per_tree": len(rows) / max(1, len(roots)),
        "max_depth": max((r["depth"] for r in rows), default=0),
        "delegation_rate": sum(r["children"] > 0 for r in rows) / max(1, len(rows)),
        "success_by_depth": {d: sum(v) / len(v) for d, v in sorted(by_depth.items())},
        "statuses": dict(Counter(r["status"] for r in rows)),
        "node_turns": sum(r["turns"] for r in rows),
        "wall_seconds": span,
    }


def load_round(cfg: RunConfig, round_: int) -> pa.Table:
    return read_partition(rollout_dir(cfg, round_), "nodes")
