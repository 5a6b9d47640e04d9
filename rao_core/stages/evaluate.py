"""The evaluation stage: policy version V on held-out tasks, a rollout with another draw, written
like a round's partition; and the paper's comparison of modes and context limits.

    eval/version=V/nodes.parquet + summary.json            (split val, eval.samples trees a task)
    compare/version=V/mode=M/ctx=C/nodes.parquet + summary.json

With `rollout.shards = S > 1` the held-out tasks are dealt into S shards like a round's
(`version=V/shard=K/`, sealed once all are complete): in parallel as Ray tasks with
`rollout.runner=ray` (flows/training.py), else one after another here. Each comparison cell is an
ordinary evaluation partition, resumable cell by cell and queryable with the same SQL.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rao_core.eval.metrics import summarize_eval
from rao_core.run import Run
from rao_core.sampler import Draw, tree_seed
from rao_core.stages.common import note, run_sharded, sample, shard_dir


def evaluation_draw(
    run: Run, version: int, samples: int | None = None, temperature: float | None = None,
    shard: tuple[int, int] = (0, 1),
) -> Draw:  # fmt: skip
    """eval.num_tasks validation tasks per difficulty, the same tasks for every policy version
    (tasks.seed), eval.samples trees each at eval.temperature."""
    cfg = run.config
    e = cfg.eval
    return Draw(
        e.split, tuple(e.difficulty), e.num_tasks, e.samples if samples is None else samples,
        e.temperature if temperature is None else temperature, task_seed=cfg.tasks.seed,
        tree_seed=tree_seed(cfg.rollout.seed, version), per_difficulty=True, shard=shard,
    )  # fmt: skip


def evaluate(run: Run, version: int) -> dict[str, Any]:
    """Evaluate policy version `version` (idempotent: a complete partition is only re-summarised,
    a complete shard is not run again)."""
    note(run, f"evaluation of version {version}")
    dest = run.layout.eval(version)
    run_shard = lambda k: evaluate_shard(run, version, k)  # noqa: E731
    run_sharded(dest, run.config.rollout.shards, f"the evaluation of version {version}", run_shard)
    return summarize_eval(dest)


def evaluate_shard(run: Run, version: int, shard: int) -> Path:
    """Shard `shard` of version `version`'s evaluation: its deal of the held-out tasks, on an engine
    replica of its own. Greedy trees do not depend on their batch, so the shards together hold
    exactly the trees of one unsharded evaluation."""
    n = run.config.rollout.shards
    dest = shard_dir(run.layout.eval(version), shard, n)
    return sample(run, dest, evaluation_draw(run, version, shard=(shard, n)), version)


def grid(run: Run) -> list[tuple[str, int]]:
    """(mode, context limit) cells of the comparison, from eval.modes and eval.context_limits."""
    cfg = run.config
    return [(m, c) for c in cfg.eval.context_limits or [cfg.agent.max_context_tokens] for m in cfg.eval.modes]


def compare(run: Run, version: int) -> dict[str, Any]:
    """Version `version` in every cell of the grid, recursive against single agent, greedy; returns
    {"version", "cells": [{"mode", "ctx", "summary"}]} (complete cells are only read back)."""
    note(run, f"comparison of version {version}")
    cells = []
    for mode, ctx in grid(run):
        agent = dataclasses.replace(run.config.agent, mode=mode, max_context_tokens=ctx)
        dest = run.layout.compare(version, mode, ctx)
        sample(run, dest, evaluation_draw(run, version), version, agent)
        cells.append({"mode": mode, "ctx": ctx, "summary": summarize_eval(dest)})
    return {"version": version, "cells": cells}
