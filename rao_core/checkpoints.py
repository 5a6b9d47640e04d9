"""A run's checkpoints, in one place: where policy version v is, where version 0 comes from,
whether a checkpoint is complete, where the trainer keeps its float32 master weights and AdamW
moments inside it, and how a new one is published (atomically: metrics.json written last, then
one rename). Torch-free: the tensors themselves are rao_core/train/state.py's.

    runs/<run>/checkpoints/version=v/            policy version v (v >= 1), as engines load it
    runs/<run>/checkpoints/version=v/trainer_state/master/        float32 master weights
    runs/<run>/checkpoints/version=v/trainer_state/optimizer.pt   AdamW's state for round v
    runs/<run>/checkpoints/warmstart/model/      a warm start trained in the run (version 0)

Version 0 is `policy.model`: a checkpoint shipped in rao_core/models/checkpoints, a local folder,
a hub id (downloaded on first use: rao_core/models/locate.py), 'warmstart' (the run's own) or
'tiny' (the untrained bootstrap model, built on first use).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from rao_core.layout import METRICS, RunLayout
from rao_core.models.locate import is_shipped, local_model

STATE = "trainer_state"
MASTER = "master"
OPTIMIZER = "optimizer.pt"


def initial_model(name: str, run_dir: Path) -> Path:
    """Policy version 0 of the run in `run_dir`: a shipped checkpoint by name, a local folder, a
    hub id (downloaded on first use), or the run's own warm start."""
    if is_shipped(name) or Path(name).is_dir():
        return local_model(name)
    if name == "warmstart":
        return RunLayout(run_dir).warmstart / "model"
    if name == "tiny":
        from rao_core.models.tiny import resolve_model

        return resolve_model("tiny")
    return local_model(name)


def is_complete(path: str | Path) -> bool:
    """A checkpoint is complete once its metrics.json exists: it is written last, before the rename."""
    return (Path(path) / METRICS).is_file()


def master_dir(ckpt: Path) -> Path | None:
    """The float32 master weights saved with checkpoint `ckpt`, if any."""
    path = Path(ckpt) / STATE / MASTER
    return path if (path / "config.json").is_file() else None


def optimizer_file(ckpt: Path) -> Path | None:
    """AdamW's saved state for the round after `ckpt` (also the layout of runs before 2026-12)."""
    for path in (Path(ckpt) / STATE / OPTIMIZER, Path(ckpt) / OPTIMIZER):
        if path.is_file():
            return path
    return None


def drop_state(ckpt: Path) -> None:
    """Forget the trainer state of an older checkpoint (its served weights stay)."""
    shutil.rmtree(Path(ckpt) / STATE, ignore_errors=True)
    (Path(ckpt) / OPTIMIZER).unlink(missing_ok=True)


def publish(tmp: Path, out_path: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """Write metrics.json last, then rename the folder into place; a concurrent winner is kept."""
    (tmp / METRICS).write_text(json.dumps(metrics, indent=2, default=str))
    if out_path.exists() and not is_complete(out_path):  # leftover of a crashed non-atomic writer
        shutil.rmtree(out_path)
    try:
        os.rename(tmp, out_path)
    except OSError:
        if not is_complete(out_path):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return json.loads((out_path / METRICS).read_text())
    return metrics


class Checkpoints:
    """Every policy version of one run: `path(v)` is what engines load and the trainer starts from."""

    def __init__(self, layout: RunLayout, model: str) -> None:
        self.layout, self.model = layout, model

    def initial(self) -> Path:
        """Version 0 (`policy.model`)."""
        return initial_model(self.model, self.layout.root)

    def path(self, version: int) -> Path:
        return self.initial() if version == 0 else self.layout.checkpoint(version)

    def metrics(self, version: int) -> dict:
        """What training wrote when it made `version` (metrics.json; {} before it exists)."""
        path = self.layout.checkpoint(version) / METRICS
        return json.loads(path.read_text()) if path.is_file() else {}
