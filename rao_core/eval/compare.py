"""The paper's comparison: one policy, recursive against single agent, across difficulties and
context limits, greedy, on held-out tasks.

    compare/version=V/mode=M/ctx=C/nodes.parquet + _COMPLETE + summary.json

Each cell is an ordinary evaluation partition (one tree per task), so it is resumable cell by cell
and queryable with the same SQL as rollouts. The policy can be any engine the configuration names
(a checkpoint through transformers or vLLM, or an OpenAI-compatible endpoint).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rao_core.config import RunConfig
from rao_core.eval.evaluate import summarize_eval
from rao_core.rollout import Draw, run_rollout


def grid(cfg: RunConfig) -> list[tuple[str, int]]:
    """(mode, context limit) cells of the comparison, from eval.modes and eval.context_limits
    (validated by load_config)."""
    return [(m, c) for c in cfg.eval.context_limits or [cfg.agent.max_context_tokens] for m in cfg.eval.modes]


def compare_version(
    cfg: RunConfig, version: int, model_path: Path | None = None, progress: bool = False
) -> dict[str, Any]:
    """Evaluate policy version `version` in every cell of the grid; returns
    {"version", "cells": [{"mode", "ctx", "summary"}]} (complete cells are only read back)."""
    cells = []
    for mode, ctx in grid(cfg):
        agent = dataclasses.replace(cfg.agent, mode=mode, max_context_tokens=ctx)
        cell_cfg = dataclasses.replace(cfg, agent=agent)
        dest = cfg.layout.compare(version, mode, ctx)
        run_rollout(cell_cfg, dest, Draw.evaluation(cfg), model_path, progress)
        cells.append({"mode": mode, "ctx": ctx, "summary": summarize_eval(dest)})
    return {"version": version, "cells": cells}
