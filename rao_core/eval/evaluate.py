"""The evaluation stage: the round's policy on held-out tasks, written like a rollout partition.

eval/version=N/nodes.parquet + summary.json     (policy version N, split val, one tree per task)

With `rollout.shards = S > 1` the held-out tasks are dealt into S shards like a round's
(`version=N/shard=K/`, sealed once all are complete), on the same engine replicas: in parallel as
Ray tasks with `rollout.runner=ray` (flows/training.py), else one after another here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rao_core.config import RunConfig
from rao_core.eval.metrics import tree_metrics
from rao_core.rollout import Draw, run_rollout, run_sharded, shard_dir
from rao_core.store.files import write_json
from rao_core.store.parquet import read_partition


def evaluate_round(
    cfg: RunConfig, round_: int, model_path: Path | None = None, progress: bool = False
) -> dict:
    """Evaluate policy version `round_` (idempotent: a complete partition is only re-summarised,
    a complete shard is not run again)."""
    dest = cfg.layout.eval(round_)
    run = lambda k: evaluate_shard(cfg, round_, k, model_path, progress)  # noqa: E731
    run_sharded(dest, cfg.rollout.shards, f"the evaluation of version {round_}", run)
    return summarize_eval(dest)


def evaluate_shard(
    cfg: RunConfig, version: int, shard: int, model_path: Path | None = None, progress: bool = False
) -> Path:
    """Shard `shard` of version `version`'s evaluation: its deal of the held-out tasks, on an engine
    replica of its own. Greedy trees do not depend on their batch, so the shards together hold
    exactly the trees of one unsharded evaluation."""
    n = cfg.rollout.shards
    dest = shard_dir(cfg.layout.eval(version), shard, n)
    return run_rollout(cfg, dest, Draw.evaluation(cfg, shard=(shard, n)), model_path, progress)


def summarize_eval(dest: Path) -> dict[str, Any]:
    summary_path = dest / "summary.json"
    if summary_path.is_file():
        return json.loads(summary_path.read_text())
    metrics = tree_metrics(read_partition(dest, "nodes").to_pylist())
    write_json(summary_path, metrics)
    return metrics
