"""Atomic file writes: through a temporary name in the same folder, then one rename, so a reader
(a resumed run, MLflow, the UI) sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Callable[[Path], Any]) -> Path:
    """Call `write(tmp)` to fill a temporary file, then rename it to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=1, default=str))
