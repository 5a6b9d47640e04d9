"""Atomic Parquet partitions: a reader sees a whole partition or none of it.

A partition is a folder (for example `rollouts/round=3/`) holding Parquet files and a `_COMPLETE`
marker. It is written under a hidden temporary name in the same parent folder, fsynced, and renamed
into place in one step, so a crash leaves at most a hidden `.tmp-*` folder that no glob matches.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MARKER = "_COMPLETE"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_partition(
    tables: dict[str, pa.Table], dest: str | Path, meta: dict | None = None, overwrite: bool = False
) -> Path:
    """Write `{file_stem: table}` as `dest/<file_stem>.parquet` plus a marker, atomically.

    Refuses to replace an existing complete partition unless `overwrite` is set, so a stage that
    runs twice never duplicates rows.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if is_complete(dest) and not overwrite:
        raise FileExistsError(f"partition already complete: {dest}")
    tmp = dest.parent / f".tmp-{dest.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for stem, table in tables.items():
            path = tmp / f"{stem}.parquet"
            pq.write_table(table, path, compression="zstd")
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        marker = tmp / MARKER
        marker.write_text(json.dumps({"rows": {k: t.num_rows for k, t in tables.items()}, **(meta or {})}))
        _fsync_dir(tmp)
        if dest.exists():  # an incomplete leftover or an overwrite: move it aside, then swap
            trash = dest.parent / f".trash-{dest.name}-{uuid.uuid4().hex[:8]}"
            os.rename(dest, trash)
            os.rename(tmp, dest)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, dest)
        _fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def is_complete(dest: str | Path) -> bool:
    return (Path(dest) / MARKER).is_file()


def read_partition(dest: str | Path, stem: str) -> pa.Table:
    dest = Path(dest)
    if not is_complete(dest):
        raise FileNotFoundError(f"no complete partition at {dest}")
    return pq.read_table(dest / f"{stem}.parquet")


def clean_temporaries(parent: str | Path) -> int:
    """Remove `.tmp-*` / `.trash-*` leftovers of crashed writers; returns how many were removed."""
    parent = Path(parent)
    n = 0
    if parent.is_dir():
        for p in parent.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)
                n += 1
    return n
