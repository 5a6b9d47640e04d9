"""Where policy version 0 comes from, without importing torch (config checks use it at load).

`policy.model` names a checkpoint shipped in rao_core/models/checkpoints, a local Hugging Face
folder, 'warmstart' (the run trains its own: <run>/checkpoints/warmstart/model) or 'tiny' (the
untrained bootstrap model, built on first use by rao_core.models.tiny).
"""

from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "checkpoints"


def model_exists(name: str) -> bool:
    return name in ("tiny", "warmstart") or (SHIPPED / name).is_dir() or Path(name).is_dir()


def warmstart_dir(run_dir: Path) -> Path:
    """The warm-start stage's work folder; its checkpoint is the `model` folder inside."""
    return run_dir / "checkpoints" / "warmstart"


def initial_model(name: str, run_dir: Path) -> Path:
    """Policy version 0: a shipped checkpoint by name, a local folder, or the run's own warm start."""
    if (SHIPPED / name).is_dir():
        return SHIPPED / name
    if Path(name).is_dir():
        return Path(name)
    if name == "warmstart":
        return warmstart_dir(run_dir) / "model"
    if name == "tiny":
        from rao_core.models.tiny import resolve_model

        return resolve_model("tiny")
    raise FileNotFoundError(f"policy.model: {name!r} is neither a shipped checkpoint nor a local folder")
