"""The `.sql` files of `sql/` (shipped as `rao_core/sql`), run with named parameters.

The RL math lives in those files so it can be read, diffed and queried on its own; Python only
binds values. Values always travel as DuckDB parameters (`$name`), never pasted into SQL text.
A file may use a subset of the parameters a caller has: only the ones it names are bound, because
DuckDB refuses parameters a statement does not use.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import duckdb

SQL_DIR = Path(__file__).resolve().parents[1] / "sql"  # a link to the repository's sql/ in a checkout

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_COMMENT = re.compile(r"--[^\n]*")


def sql_path(name: str) -> Path:
    """`node_rewards` or `reports/success_by_depth.sql` -> the file under sql/."""
    path = SQL_DIR / (name if name.endswith(".sql") else f"{name}.sql")
    if not path.is_file():
        raise FileNotFoundError(f"no SQL file {name!r} under {SQL_DIR}")
    return path


@functools.cache
def load_sql(name: str) -> str:
    return sql_path(name).read_text()


def param_names(sql: str) -> set[str]:
    """Named parameters (`$name`) a statement uses; comments are ignored."""
    return set(_PARAM.findall(_COMMENT.sub("", sql)))


def run_sql(
    con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any] | None = None
) -> duckdb.DuckDBPyConnection:
    """Execute one SQL file with the named parameters it uses; returns the connection to fetch from."""
    sql = load_sql(name)
    needed = param_names(sql)
    missing = needed - set(params or {})
    if missing:
        raise KeyError(f"{name}.sql needs parameters {sorted(missing)}")
    return con.execute(sql, {k: v for k, v in (params or {}).items() if k in needed})
