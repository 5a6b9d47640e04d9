"""The suite's files: synthetic train and val tasks, or the real oolong-real rows as val.

Here, not in tasks.py, so the task generator and the real-data loader (which builds Tasks) do not
import each other."""

from __future__ import annotations

from pathlib import Path

from rao_core.envs.args import OolongArgs
from rao_core.envs.oolong.real import load_real
from rao_core.envs.oolong.tasks import make_tasks, write_tasks


def synthesize(cfg: OolongArgs, out: Path) -> None:
    """train.parquet and val.parquet; with suite_args.real_path, val holds the real rows instead."""
    write_tasks(make_tasks(cfg, "train"), out / "train.parquet")
    if cfg.real_path:
        val = load_real(Path(cfg.real_path), cfg)
    else:
        val = make_tasks(cfg, "val")
    write_tasks(val, out / "val.parquet")
