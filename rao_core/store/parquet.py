"""Atomic Parquet partitions: a reader sees a whole partition or none of it.

A partition is a folder (for example `rollouts/round=3/`) holding Parquet files and a `_COMPLETE`
marker. It is written under a hidden temporary name in the same parent folder, fsynced, and renamed
into place in one step, so a crash leaves at most a hidden `.tmp-*` folder that no glob matches.

A partition written by several workers at once (the shards of a round, `round=3/shard=0/`, ...)
is a folder of complete sub-partitions, sealed by a marker of its own that lists them once every
one is complete (`seal_partition`): readers (`partition_files`, `read_partition`) then see the
shards as one table, and before the seal they see none of it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
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


def read_meta(dest: str | Path) -> dict:
    """The marker of a complete partition: row counts and what its writer recorded."""
    return json.loads((Path(dest) / MARKER).read_text())


def partition_files(dest: str | Path, stem: str) -> list[Path]:
    """The `<stem>.parquet` files of a complete partition: its own, or those of the sub-partitions
    its marker lists (a sealed sharded partition), in shard order."""
    dest = Path(dest)
    if not is_complete(dest):
        raise FileNotFoundError(f"no complete partition at {dest}")
    parts = read_meta(dest).get("parts")
    return [dest / p / f"{stem}.parquet" for p in parts] if parts else [dest / f"{stem}.parquet"]


def read_partition(dest: str | Path, stem: str) -> pa.Table:
    tables = [pq.read_table(f) for f in partition_files(dest, stem)]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def seal_partition(dest: str | Path, parts: list[str], meta: dict | None = None) -> Path:
    """Mark `dest` complete as the union of its complete sub-partitions `dest/<part>`.

    The marker is written last and atomically (temporary file, rename), so a reader sees all the
    parts or none; its `rows` are the parts' sums. Sealing twice rewrites the same marker.
    """
    dest = Path(dest)
    missing = [p for p in parts if not is_complete(dest / p)]
    if missing:
        raise FileNotFoundError(f"cannot seal {dest}: incomplete parts {missing}")
    rows: dict[str, int] = {}
    for p in parts:
        for stem, n in read_meta(dest / p)["rows"].items():
            rows[stem] = rows.get(stem, 0) + n
    clean_temporaries(dest, MARKER)  # a marker of a sealer that crashed before its rename
    tmp = dest / f".tmp-{MARKER}-{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps({"rows": rows, "parts": list(parts), **(meta or {})}))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dest / MARKER)
    _fsync_dir(dest)
    return dest


def set_aside(dest: str | Path, why: str) -> Path:
    """Move a complete partition out of every reader's way (a hidden `.<why>-<name>-<time>` folder
    beside it, which no glob of the views matches), so that the stage writes it again; returns
    where it went. For a partition whose rows are known to be wrong (a broken scorer's)."""
    dest = Path(dest)
    aside = dest.parent / f".{why}-{dest.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    os.rename(dest, aside)
    _fsync_dir(dest.parent)
    return aside


def clean_temporaries(parent: str | Path, name: str | None = None) -> int:
    """Remove `.tmp-*` / `.trash-*` leftovers of crashed writers (only those of partition `name`
    when given, so that concurrent writers of sibling partitions keep theirs); returns how many."""
    parent = Path(parent)
    prefixes = (".tmp-", ".trash-") if name is None else (f".tmp-{name}-", f".trash-{name}-")
    n = 0
    if parent.is_dir():
        for p in parent.iterdir():
            if p.name.startswith(prefixes):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                n += 1
    return n
