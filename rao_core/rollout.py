"""The rollout stage: draw the trees, run them, write their nodes as one atomic Parquet partition.

    draw:  a Draw (which tasks of which split, how many, G trees each, at what temperature)
    run:   every tree on one event loop through the tree runner (rao_core/agent/runner.py)
    write: one row per node -> runs/<run>/rollouts/round=N/nodes.parquet (evaluation: eval/version=V)

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from rao_core.agent.prompts import ChatFraming
from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.checkpoints import initial_model
from rao_core.config import RunConfig
from rao_core.envs.base import select_tasks
from rao_core.envs.suites import open_suite
from rao_core.judges import build_judge
from rao_core.models.tokenizer import load_tokenizer
from rao_core.policy import Policy
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


def shard_dir(dest: Path, shard: int, shards: int) -> Path:
    """Shard K's partition of `dest` (a round, or an evaluated version): `dest/shard=K/`, or `dest`
    itself when there is one shard (so `shards = 1` keeps the unsharded layout)."""
    return dest if shards == 1 else dest / f"shard={shard}"


def shard_tasks(tasks: Sequence[T], shards: int) -> list[list[T]]:
    """Deal root tasks round-robin into `shards` lists. Deterministic (the task draw is seeded),
    every tree of a task lands in the same shard (its group baseline stays whole), and a
    difficulty mix is spread evenly."""
    return [list(tasks[k::shards]) for k in range(shards)]


def make_policy(cfg: RunConfig, suite, model_path: Path | None = None) -> tuple[Policy, Any]:
    """The suite's scripted expert, or a model engine serving `model_path` (default policy.model);
    returned with the tokenizer that frames the conversation: policy.tokenizer, or with 'auto' the
    checkpoint's own (models) or 'tiny' (the scripted expert). A vLLM server comes from the current
    EngineScope (rao_core/engines/scope.py)."""
    if cfg.policy.kind == "scripted":
        name = "tiny" if cfg.policy.tokenizer == "auto" else cfg.policy.tokenizer
        expert = suite.expert()
        if expert is None:
            raise ValueError(f"policy.kind: 'scripted': suite {cfg.suite} has no scripted expert")
        return expert, load_tokenizer(name)
    from rao_core.engines import build_engine

    path = model_path or initial_model(cfg.policy.model, cfg.run_dir)  # shipped, folder, hub id, 'tiny'
    tokenizer = load_tokenizer(str(path) if cfg.policy.tokenizer == "auto" else cfg.policy.tokenizer)
    policy_cfg = dataclasses.replace(engine_config(cfg), model=str(path))
    lora_rank = cfg.train.lora_r if cfg.train.lora else 0
    engine = build_engine(policy_cfg, tokenizer, cfg.agent.max_context_tokens, lora_rank=lora_rank)
    return engine, tokenizer


def engine_config(cfg: RunConfig):
    """policy.* as the engines see it: under rollout.runner=ray, `engine_processes: auto` is 0
    (each Ray task is already an engine replica; docs/engines.md)."""
    if cfg.rollout.runner == "ray" and getattr(cfg.policy, "engine_processes", None) == "auto":
        return dataclasses.replace(cfg.policy, engine_processes=0)
    return cfg.policy


def chat_framing(cfg: RunConfig, tokenizer) -> ChatFraming:
    """The conversation framing of every node: the tokenizer's chat template with policy.chat_template_kwargs."""
    return ChatFraming(tokenizer, cfg.policy.chat_template_kwargs)


def sampling_seed(cfg: RunConfig) -> int:
    """The trees' seed: every sampling request and scripted choice derives from it, the tree and
    the node (rao_core.agent.node.request_seed), so a round reruns token for token."""
    return cfg.rollout.seed * 1_000_003 + cfg.rollout.round


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
    dest, n = cfg.layout.rollouts(cfg.rollout.round), cfg.rollout.shards
    return run_sharded(
        dest, n, f"round {cfg.rollout.round}", lambda k: rollout_shard(cfg, k, progress, model_path)
    )


def run_sharded(dest: Path, shards: int, what: str, run_shard: Callable[[int], Path]) -> Path:
    """The partition `dest` as `shards` shards (a round, or an evaluated version): unless it is
    complete, run every shard (each a no-op when complete) in turn, then seal it."""
    if not is_complete(dest):
        check_shard_count(dest, shards, what)
        for k in range(shards):
            run_shard(k)
    return seal_shards(dest, shards)


def rollout_shard(cfg: RunConfig, shard: int, progress: bool = False, model_path: Path | None = None) -> Path:
    """Shard `shard` of round `rollout.round`: its share of the root tasks, G trees each, on an
    engine replica of its own, written as its own partition. Idempotent, so a retried shard whose
    partition is complete is a no-op and an incomplete one is rewritten whole."""
    n = cfg.rollout.shards
    dest = shard_dir(cfg.layout.rollouts(cfg.rollout.round), shard, n)
    return run_rollout(cfg, dest, Draw.training(cfg, shard=(shard, n)), model_path, progress)


def check_shard_count(dest: Path, shards: int, what: str) -> None:
    """A partition started with S shards is finished with S: its complete shards hold the tasks
    dealt k::S, and another count would deal the rest differently (duplicated and missing tasks)."""
    for part in dest.glob("shard=*"):
        if is_complete(part):
            started = read_meta(part).get("shard", [0, shards])[1]
            if started != shards:
                raise ValueError(
                    f"rollout.shards: {shards}: {what} was started with {started} shards; finish it "
                    f"with rollout.shards={started} (a new count applies from the next round)"
                )


def seal_shards(dest: Path, shards: int) -> Path:
    """Mark a sharded partition complete once every shard is (a no-op for one shard or a sealed
    partition): from then on readers see the shards as one table."""
    if shards == 1 or is_complete(dest):
        return dest
    parts = [shard_dir(dest, k, shards).name for k in range(shards)]
    metas = [read_meta(dest / p) for p in parts if is_complete(dest / p)]
    meta = {  # the partition's wall time is its slowest shard's
        "trees": sum(m.get("trees", 0) for m in metas),
        "seconds": max((m.get("seconds", 0.0) for m in metas), default=0.0),
    }
    return seal_partition(dest, parts, meta)


@dataclass(frozen=True)
class Draw:
    """Which trees a rollout runs: `num_tasks` tasks of `split` (per difficulty, or over the mix),
    drawn with `task_seed` (None: a new draw each round), `group_size` trees each, sampled at
    `temperature`; with `shard = (k, n)` only the k-th of n deals of those tasks."""

    split: str
    difficulties: tuple[str, ...]
    num_tasks: int
    group_size: int
    temperature: float
    per_difficulty: bool = False
    task_seed: int | None = None
    shard: tuple[int, int] = (0, 1)

    @classmethod
    def training(cls, cfg: RunConfig, shard: tuple[int, int] = (0, 1)) -> Draw:
        """A training round: rollout.*, sampled at policy.temperature."""
        r = cfg.rollout
        return cls(r.split, tuple(r.difficulty), r.num_tasks, r.group_size, cfg.policy.temperature,
                   shard=shard)  # fmt: skip

    @classmethod
    def evaluation(
        cls, cfg: RunConfig, samples: int | None = None, temperature: float | None = None,
        shard: tuple[int, int] = (0, 1),
    ) -> Draw:  # fmt: skip
        """Held-out evaluation: eval.num_tasks validation tasks per difficulty, the same tasks for
        every policy version (tasks.seed), eval.samples trees each at eval.temperature."""
        e = cfg.eval
        return cls(
            e.split, tuple(e.difficulty), e.num_tasks, e.samples if samples is None else samples,
            e.temperature if temperature is None else temperature, per_difficulty=True, task_seed=cfg.tasks.seed,
            shard=shard,
        )  # fmt: skip


def draw_trees(cfg: RunConfig, suite, draw: Draw) -> list[TreeSpec]:
    """The draw's tree specs, seeded: the same configuration always draws the same trees."""
    seed = cfg.tasks.seed + cfg.rollout.round if draw.task_seed is None else draw.task_seed
    pool = suite.tasks(draw.split)
    groups = [[d] for d in draw.difficulties] if draw.per_difficulty else [list(draw.difficulties)]
    tasks = [t for g in groups for t in select_tasks(pool, draw.split, g, draw.num_tasks, seed=seed)]
    if not tasks:
        raise ValueError(
            f"rollout.difficulty: no {draw.split} tasks of difficulty {','.join(draw.difficulties)!r} in this world"
        )
    tasks = shard_tasks(tasks, draw.shard[1])[draw.shard[0]]
    tree_seed = sampling_seed(cfg)
    return [
        TreeSpec(t.task_id, g, suite.env(t), t.difficulty, seed=tree_seed)
        for t in tasks
        for g in range(draw.group_size)
    ]


def run_rollout(
    cfg: RunConfig, dest: Path, draw: Draw, model_path: Path | None = None, progress: bool = False
) -> Path:
    """Draw the trees, run them, write their nodes as the partition `dest` (idempotent: a complete
    partition is returned as it is)."""
    if is_complete(dest):
        return dest
    clean_temporaries(dest.parent, dest.name)  # only its own: sibling shards may be writing
    suite = open_suite(cfg)
    specs = draw_trees(cfg, suite, draw)
    policy, tokenizer = make_policy(cfg, suite, model_path)
    chat = chat_framing(cfg, tokenizer)
    judge = build_judge(cfg.judge, cfg.run_dir)

    async def main(on_tree_done: Callable[[TreeRun], None] | None) -> list[TreeRun]:
        try:
            return await run_trees(
                specs, policy, chat, cfg.agent, cfg.sandbox, draw.temperature,
                cfg.rollout.max_concurrent_trees, judge, cfg.policy.retries, on_tree_done,
            )  # fmt: skip
        finally:
            await policy.close()
            if judge is not None:
                await judge.close()

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
    rows = [row for run in runs for row in tree_rows(run, cfg, draw.split)]
    table = pa.Table.from_pylist(rows, schema=NODE_SCHEMA)
    meta = {"trees": len(runs), "seconds": round(time.time() - start, 3), "shard": list(draw.shard)}
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
            "finish_message",
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
        # of those, nodes whose scorer broke the reward contract (envs/base.py success_value)
        "scorer_failed_nodes": sum(r["finish_message"].startswith("scorer:") for r in infra),
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
