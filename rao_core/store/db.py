"""One DuckDB connection over a run's Parquet tables: views `nodes`, `scores` and `samples`.

The views cover the complete partitions only (those with a `_COMPLETE` marker), listed when the
connection opens: a partition being written meanwhile is not seen until the next connect. A run
with no rollouts or no scores yet still gets every view, empty, with the right columns.

Read-only mode locks the connection down: DuckDB may read exactly the listed Parquet files and
nothing else (no other file, no COPY/EXPORT target), and its configuration cannot be changed.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from rao_core.store.parquet import is_complete, partition_files
from rao_core.store.schema import NODE_SCHEMA, SCORES_SCHEMA
from rao_core.store.sqlfiles import run_sql


def complete_files(run_dir: str | Path, table: str, stem: str) -> list[Path]:
    """`run_dir/<table>/round=*/<stem>.parquet` of complete partitions, in round order (a sharded
    round contributes the files of the shards its marker lists, `round=N/shard=K/<stem>.parquet`)."""
    parts = [p for p in (Path(run_dir) / table).glob("round=*") if p.is_dir() and is_complete(p)]
    parts.sort(key=lambda p: (len(p.name), p.name))  # round=10 after round=9
    return [f for p in parts for f in partition_files(p, stem) if f.is_file()]


def _view(con: duckdb.DuckDBPyConnection, name: str, files: list[Path], empty: pa.Schema) -> None:
    # Paths go through the relational API (a Python list, no SQL text): CREATE VIEW cannot take
    # prepared parameters, and pasting paths into SQL is what this project never does.
    if files:
        rel = con.read_parquet([str(f) for f in files], union_by_name=True)
    else:
        rel = con.from_arrow(empty.empty_table())
    rel.create_view(name, replace=True)


def connect(run_dir: str | Path, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with views over the run's `nodes`, `scores` and trained `samples`."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    nodes = complete_files(run_dir, "rollouts", "nodes")
    scores = complete_files(run_dir, "scores", "scores")
    con = duckdb.connect()
    _view(con, "nodes", nodes, NODE_SCHEMA)
    _view(con, "scores", scores, SCORES_SCHEMA)
    run_sql(con, "views/samples")
    if read_only:
        con.execute("SET allowed_paths = $paths", {"paths": [str(f) for f in nodes + scores]})
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    return con
