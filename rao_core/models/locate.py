"""Where a named model lives, without importing torch or another models module (config checks
use it at load).

A name is a checkpoint shipped in rao_core/models/checkpoints, a local Hugging Face folder, or a
hub id found in the local Hugging Face cache (`Qwen/Qwen3-0.6B`: nothing is downloaded). Every
consumer (trainer, transformers engine, vLLM) is given the local folder. A LoRA checkpoint is
peft's adapter folder, naming its base.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "checkpoints"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # org/name, as on the Hugging Face hub


def is_shipped(name: str) -> bool:
    """A checkpoint that ships in rao_core/models/checkpoints (the tiny models), by its name."""
    return "/" not in name and name not in ("", ".", "..") and (SHIPPED / name).is_dir()


def hub_snapshot(name: str) -> Path | None:
    """The cached snapshot folder of hub id `name` (HF_HUB_CACHE / HF_HOME), or None: never downloads."""
    if not HUB_ID.match(name) or Path(name).exists():
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        return None


def not_found(name: str) -> str:
    """Why `name` names no model here, in one line."""
    if HUB_ID.match(name):
        from huggingface_hub.constants import HF_HUB_CACHE

        return (
            f"{name!r} is not in the Hugging Face cache ({HF_HUB_CACHE}): nothing is downloaded at run "
            f"time; fetch it first (`huggingface-cli download {name}`) or give a local folder"
        )
    return (
        f"{name!r} is neither a shipped checkpoint, a local folder, a cached hub id, 'warmstart' nor 'tiny'"
    )


def model_exists(name: str) -> bool:
    if name in ("tiny", "warmstart") or is_shipped(name) or Path(name).is_dir():
        return True
    return hub_snapshot(name) is not None


def local_model(name: str) -> Path:
    """A shipped checkpoint, a local folder or a cached hub id, as a local folder."""
    if is_shipped(name):
        return SHIPPED / name
    if Path(name).is_dir():
        return Path(name)
    snapshot = hub_snapshot(name)
    if snapshot is None:
        raise FileNotFoundError(not_found(name))
    return snapshot


def is_adapter(path: Path) -> bool:
    """A LoRA checkpoint (peft's adapter folder, served over its base) rather than a whole model."""
    return (Path(path) / "adapter_config.json").is_file()


def adapter_base(path: Path) -> Path:
    """The base model an adapter folder applies to (its adapter_config.json names it)."""
    base = json.loads((Path(path) / "adapter_config.json").read_text())["base_model_name_or_path"]
    return local_model(base)
