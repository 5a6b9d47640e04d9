"""The rollout stage: G trees for each of N root tasks, written as one atomic Parquet partition.

synthesize (if the run has no data yet) -> select tasks -> run all trees concurrently on one
event loop -> rows (one per node) -> runs/<run>/rollouts/round=N/nodes.parquet
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from rao_core.agent.policy import Policy
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.sandbox import shutdown_sandboxes
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import RunConfig, save_config
from rao_core.envs.textcraft import World, env_from_task, load_tasks, select_tasks, synthesize
from rao_core.envs.textcraft.expert import TextCraftExpert
from rao_core.models.tokenizer import load_tokenizer
from rao_core.store.parquet import clean_temporaries, is_complete, read_partition, write_partition
from rao_core.store.schema import NODE_SCHEMA


def data_dir(cfg: RunConfig) -> Path:
    return cfg.run_dir / "data" / cfg.suite


def ensure_data(cfg: RunConfig) -> Path:
    """Synthesize the world and task files once per run; later stages only read them."""
    out = data_dir(cfg)
    if not all((out / f).is_file() for f in ("world.json", "train.parquet", "val.parquet")):
        out.mkdir(parents=True, exist_ok=True)
        synthesize(cfg.world, cfg.tasks, out)
    return out


def rollout_dir(cfg: RunConfig, round_: int) -> Path:
    return cfg.run_dir / "rollouts" / f"round={round_}"


def make_policy(cfg: RunConfig, world: World) -> Policy:
    if cfg.policy.kind == "scripted":
        return TextCraftExpert(
            world, cfg.policy.error_rate, cfg.policy.latency_s, reply_format=cfg.agent.reply_format
        )
    raise ValueError(f"policy.kind: unknown policy {cfg.policy.kind!r}")


async def run_trees(
    specs: list[TreeSpec],
    policy: Policy,
    chat: ChatFraming,
    cfg: RunConfig,
    on_tree_done: Callable[[TreeRun], None] | None = None,
) -> list[TreeRun]:
    """Run every tree on this event loop, at most `max_concurrent_trees` at a time."""
    gate = asyncio.Semaphore(cfg.rollout.max_concurrent_trees)

    async def one(spec: TreeSpec) -> TreeRun:
        async with gate:
            run = TreeRun(spec, policy, chat, cfg.agent, cfg.sandbox, cfg.policy.temperature)
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


def rollout_round(cfg: RunConfig, progress: bool = False) -> Path:
    """Roll out one round; a round whose partition is already complete is not run again."""
    dest = rollout_dir(cfg, cfg.rollout.round)
    if is_complete(dest):
        return dest
    clean_temporaries(dest.parent)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cfg.run_dir / "config.yaml")
    ddir = ensure_data(cfg)
    world = World.from_json((ddir / "world.json").read_text())
    split = cfg.rollout.split
    tasks = select_tasks(
        load_tasks(ddir / f"{split}.parquet"),
        split,
        [d.strip() for d in cfg.rollout.difficulty.split(",")],
        cfg.rollout.num_tasks,
        seed=cfg.tasks.seed + cfg.rollout.round,
    )
    if not tasks:
        raise ValueError(
            f"rollout.difficulty: no {split} tasks of difficulty {cfg.rollout.difficulty!r} in this world"
        )
    specs = [
        TreeSpec(t.task_id, g, env_from_task(world, t), t.difficulty, seed=cfg.rollout.round)
        for t in tasks
        for g in range(cfg.rollout.group_size)
    ]
    policy = make_policy(cfg, world)
    chat = ChatFraming(load_tokenizer(cfg.policy.tokenizer))

    async def main(on_tree_done: Callable[[TreeRun], None] | None) -> list[TreeRun]:
        try:
            return await run_trees(specs, policy, chat, cfg, on_tree_done)
        finally:
            await shutdown_sandboxes()  # leave no worker behind, whatever happened

    start = time.time()
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress("[bold]rollout", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
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


def describe(summary: dict) -> str:
    return json.dumps(summary, indent=2, default=str)
