"""The evaluation stage: the round's policy on held-out tasks, written like a rollout partition.

eval/version=N/nodes.parquet + summary.json     (policy version N, split val, one tree per task)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rao_core.config import RunConfig
from rao_core.eval.metrics import tree_metrics
from rao_core.rollout import Draw, run_rollout
from rao_core.store.files import write_json
from rao_core.store.parquet import read_partition


def evaluate_round(
    cfg: RunConfig, round_: int, model_path: Path | None = None, progress: bool = False
) -> dict:
    """Evaluate policy version `round_` (idempotent: a complete partition is only re-summarised)."""
    dest = cfg.layout.eval(round_)
    run_rollout(cfg, dest, Draw.evaluation(cfg), model_path, progress)
    return summarize_eval(dest)


def summarize_eval(dest: Path) -> dict[str, Any]:
    summary_path = dest / "summary.json"
    if summary_path.is_file():
        return json.loads(summary_path.read_text())
    metrics = tree_metrics(read_partition(dest, "nodes").to_pylist())
    write_json(summary_path, metrics)
    return metrics
