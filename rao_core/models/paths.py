"""Where policy version 0 of a run comes from (a run's own folders, or a named model).

`policy.model` names a checkpoint shipped in rao_core/models/checkpoints, a local Hugging Face
folder, a cached hub id (locate.py), 'warmstart' (the run trains its own:
<run>/checkpoints/warmstart/model) or 'tiny' (the untrained bootstrap model, built on first use by
rao_core.models.tiny).
"""

from __future__ import annotations

from pathlib import Path

from rao_core.layout import RunLayout
from rao_core.models.locate import is_shipped, local_model


def initial_model(name: str, run_dir: Path) -> Path:
    """Policy version 0: a shipped checkpoint by name, a local folder, a cached hub id, or the
    run's own warm start."""
    if is_shipped(name) or Path(name).is_dir():
        return local_model(name)
    if name == "warmstart":
        return RunLayout(run_dir).warmstart / "model"
    if name == "tiny":
        from rao_core.models.tiny import resolve_model

        return resolve_model("tiny")
    return local_model(name)
