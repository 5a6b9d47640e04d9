"""The rollout stage: G trees for each of N root tasks, written as one atomic Parquet partition.

synthesize (if the run has no data yet) -> select tasks -> run all trees concurrently on one
event loop -> rows (one per node) -> runs/<run>/rollouts/round=N/nodes.parquet

Scale-out (docs/scale-out.md): with `rollout.shards = S > 1` the round's root tasks are dealt into
S shards; each shard builds its own engine replica and writes `round=N/shard=K/` atomically, and the
round is sealed (its marker lists the shards) once all are complete. Shards run one after another
here, or in parallel as Ray tasks (flows/training.py); either way a complete shard is never rerun.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from rao_core.agent.policy import Policy
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.sandbox import shutdown_sandboxes
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import RunConfig
from rao_core.envs.base import select_tasks
from rao_core.envs.suites import open_suite
from rao_core.judges import Judge, build_judge
from rao_core.models.paths import initial_model
from rao_core.models.tokenizer import load_tokenizer
from rao_core.store.parquet import (
    clean_temporaries,
    is_complete,
    read_meta,
    read_partition,
    seal_partition,
    write_partition,
)
from rao_core.store.schema import NODE_SCHEMA

T = TypeVar("T")


def shard_dir(cfg: RunConfig, round_: int, shard: int) -> Path:
    """Shard K's partition: `round=N/shard=K/`, or the round's own folder when there is one shard
    (so `shards = 1` keeps the unsharded layout)."""
    dest = cfg.layout.rollouts(round_)
    return dest if cfg.rollout.shards == 1 else dest / f"shard={shard}"


def shard_tasks(tasks: Sequence[T], shards: int) -> list[list[T]]:
    """Deal root tasks round-robin into `shards` lists. Deterministic (the task draw is seeded),
    every tree of a task lands in the same shard (its group baseline stays whole), and a
    difficulty mix is spread evenly."""
    return [list(tasks[k::shards]) for k in range(shards)]


def make_policy(cfg: RunConfig, suite, model_path: Path | None = None) -> tuple[Policy, Any]:
    """The suite's scripted expert, or a model engine serving `model_path` (default policy.model);
    returned with the tokenizer that frames the conversation: policy.tokenizer, or with 'auto' the
    checkpoint's own (models) or 'tiny' (the scripted expert)."""
    if cfg.policy.kind == "scripted":
        name = "tiny" if cfg.policy.tokenizer == "auto" else cfg.policy.tokenizer
        return suite.expert(cfg), load_tokenizer(name)
    from rao_core.engines import build_engine

    path = model_path or initial_model(cfg.policy.model, cfg.run_dir)  # shipped, folder, hub id, 'tiny'
    tokenizer = load_tokenizer(str(path) if cfg.policy.tokenizer == "auto" else cfg.policy.tokenizer)
    policy_cfg = dataclasses.replace(cfg.policy, model=str(path))
    log_path = cfg.layout.logs / "vllm.log"
    lora_rank = cfg.train.lora_r if cfg.train.lora else 0
    return build_engine(policy_cfg, tokenizer, serving_context(cfg), log_path, lora_rank=lora_rank), tokenizer


def chat_framing(cfg: RunConfig, tokenizer) -> ChatFraming:
    """The conversation framing of every node: the tokenizer's chat template with policy.chat_template_kwargs."""
    return ChatFraming(tokenizer, cfg.policy.chat_template_kwargs)


def serving_context(cfg: RunConfig) -> int:
    """Tokens per sequence an engine server must hold: the agent's context, or the largest context
    limit `rao eval --compare` asks for (one server serves every stage)."""
    limits = [int(x) for x in cfg.eval.context_limits.split(",") if x]
    return max([cfg.agent.max_context_tokens, *limits])


def sampling_seed(cfg: RunConfig) -> int:
    """The trees' seed: every sampling request and scripted choice derives from it, the tree and
    the node (rao_core.agent.node.request_seed), so a round reruns token for token."""
    return cfg.rollout.seed * 1_000_003 + cfg.rollout.round


async def run_trees(
    specs: list[TreeSpec],
    policy: Policy,
    chat: ChatFraming,
    cfg: RunConfig,
    temperature: float,
    on_tree_done: Callable[[TreeRun], None] | None = None,
    judge: Judge | None = None,
) -> list[TreeRun]:
    """Run every tree on this event loop, at most `max_concurrent_trees` at a time; `judge`
    scores the nodes whose environment has no exact verifier (docs/judges.md)."""
    gate = asyncio.Semaphore(cfg.rollout.max_concurrent_trees)

    async def one(spec: TreeSpec) -> TreeRun:
        async with gate:
            run = TreeRun(spec, policy, chat, cfg.agent, cfg.sandbox, temperature, judge, cfg.policy.retries)
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


def rollout_round(cfg: RunConfig, progress: bool = False, model_path: Path | None = None) -> Path:
    """Roll out one training round; a round whose partition is already complete is not run again.
    Shards not yet complete run here one after another (a Ray cluster runs them in parallel first:
    flows/training.py), then the round is sealed."""
    if not is_complete(cfg.layout.rollouts(cfg.rollout.round)):
        check_shard_count(cfg)
        for k in range(cfg.rollout.shards):
            rollout_shard(cfg, k, progress, model_path)
    return seal_round(cfg)


def rollout_shard(cfg: RunConfig, shard: int, progress: bool = False, model_path: Path | None = None) -> Path:
    """Shard `shard` of round `rollout.round`: its share of the root tasks, G trees each, on an
    engine replica of its own, written as its own partition. Idempotent, so a retried shard whose
    partition is complete is a no-op and an incomplete one is rewritten whole."""
    r = cfg.rollout
    return run_rollout(
        cfg, shard_dir(cfg, r.round, shard), r.split, r.difficulty, r.num_tasks, r.group_size,
        cfg.policy.temperature, progress, model_path, shard=(shard, r.shards),
    )  # fmt: skip


def check_shard_count(cfg: RunConfig) -> None:
    """A round started with S shards is finished with S: its complete shards hold the tasks dealt
    k::S, and another count would deal the rest differently (duplicated and missing tasks)."""
    dest = cfg.layout.rollouts(cfg.rollout.round)
    for part in dest.glob("shard=*"):
        if is_complete(part):
            started = read_meta(part).get("shard", [0, cfg.rollout.shards])[1]
            if started != cfg.rollout.shards:
                raise ValueError(
                    f"rollout.shards: {cfg.rollout.shards}: round {cfg.rollout.round} was started with "
                    f"{started} shards; finish it with rollout.shards={started} (a new count applies from the next round)"
                )


def seal_round(cfg: RunConfig) -> Path:
    """Mark a sharded round complete once every shard is (a no-op for one shard or a sealed round):
    from then on readers see the shards as one table."""
    dest = cfg.layout.rollouts(cfg.rollout.round)
    if cfg.rollout.shards == 1 or is_complete(dest):
        return dest
    parts = [shard_dir(cfg, cfg.rollout.round, k).name for k in range(cfg.rollout.shards)]
    metas = [read_meta(dest / p) for p in parts if is_complete(dest / p)]
    meta = {  # the round's wall time is its slowest shard's
        "trees": sum(m.get("trees", 0) for m in metas),
        "seconds": max((m.get("seconds", 0.0) for m in metas), default=0.0),
    }
    return seal_partition(dest, parts, meta)


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
    task_seed: int | None = None,
    shard: tuple[int, int] = (0, 1),
) -> Path:
    """G trees for each of N tasks of a split (N per difficulty with `per_difficulty`), written as
    the partition `dest` (idempotent). Tasks are drawn with `task_seed` (default: a new draw each
    round; evaluations pass a fixed seed so every policy version meets the same tasks). With
    `shard = (k, n)` only the k-th of n deals of those tasks is rolled out (`shard_tasks`)."""
    if is_complete(dest):
        return dest
    clean_temporaries(dest.parent, dest.name)  # only its own: sibling shards may be writing
    suite = open_suite(cfg)
    difficulties = [d.strip() for d in difficulty.split(",")]
    seed = cfg.tasks.seed + cfg.rollout.round if task_seed is None else task_seed
    pool = suite.tasks(split)
    groups = [[d] for d in difficulties] if per_difficulty else [difficulties]
    tasks = [t for g in groups for t in select_tasks(pool, split, g, num_tasks, seed=seed)]
    if not tasks:
        raise ValueError(f"rollout.difficulty: no {split} tasks of difficulty {difficulty!r} in this world")
    tasks = shard_tasks(tasks, shard[1])[shard[0]]
    seed = sampling_seed(cfg)
    specs = [
        TreeSpec(t.task_id, g, suite.env(t), t.difficulty, seed=seed)
        for t in tasks
        for g in range(group_size)
    ]
    policy, tokenizer = make_policy(cfg, suite, model_path)
    chat = chat_framing(cfg, tokenizer)
    judge = build_judge(cfg.judge, cfg.run_dir)

    async def main(on_tree_done: Callable[[TreeRun], None] | None) -> list[TreeRun]:
        try:
            return await run_trees(specs, policy, chat, cfg, temperature, on_tree_done, judge)
        finally:
            await policy.close()
            if judge is not None:
                await judge.close()
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
    meta = {"trees": len(runs), "seconds": round(time.time() - start, 3), "shard": list(shard)}
    try:
        return write_partition({"nodes": table}, dest, meta=meta)
    except FileExistsError:  # a presumed-lost attempt of this shard finished first: keep its rows
        return dest


def summarize(table: pa.Table) -> dict:
    """Headline figures of one rollout partition, for the CLI and for tracking."""
    rows = table.select(
        [
            "tree_id",
            "depth",
            "status",
            "tree_status",
            "success",
            "turns",
            "children",
            "started_at",
            "ended_at",
        ]
    ).to_pylist()
    roots = [r for r in rows if r["depth"] == 0]
    by_depth: dict[int, list[float]] = {}
    for r in rows:
        by_depth.setdefault(r["depth"], []).append(r["success"])
    span = max(r["ended_at"] for r in rows) - min(r["started_at"] for r in rows) if rows else 0.0
    infra = [r for r in rows if r["status"] == "infra_error"]
    return {
        "trees": len(roots),
        "nodes": len(rows),
        "infra_failed_nodes": len(infra),
        "infra_failed_trees": len({r["tree_id"] for r in rows if r["tree_status"] == "infra_error"}),
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
    return read_partition(cfg.layout.rollouts(round_), "nodes")
