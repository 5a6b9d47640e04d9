"""Read-only SQL over a run's tables (`rao sql`): one query in, a readable table out.

A statement is accepted only if DuckDB itself classifies it as a query (SELECT, WITH, FROM,
VALUES, DESCRIBE, SHOW, SUMMARIZE, PRAGMA show_tables...) or as a plain EXPLAIN of one; anything
else (INSERT, COPY, CREATE, SET, ATTACH, CALL, EXPLAIN ANALYZE of a write...) is refused before it
runs. The connection is also locked to the run's Parquet files (rao_core.store.db), so even a
query cannot read or write any other file.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Console
from rich.table import Table

from rao_core.store.db import connect

_READ_TYPES = {duckdb.StatementType.SELECT}
_EXPLAIN = re.compile(r"^\s*explain\s+(analy[sz]e\s+)?", re.IGNORECASE)


class QueryError(Exception):
    """A refused or failed query; the message is one line, DuckDB's own where DuckDB failed."""


def _one_line(err: Exception) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__


def _statements(con: duckdb.DuckDBPyConnection, sql: str) -> list:
    try:
        return con.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(_one_line(e)) from None


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise QueryError unless `sql` is exactly one read-only query."""
    stmts = _statements(con, sql)
    if len(stmts) != 1:
        raise QueryError(f"expected exactly one statement, got {len(stmts)}")
    kind = stmts[0].type
    if kind == duckdb.StatementType.EXPLAIN:
        # EXPLAIN ANALYZE runs its statement; a plain EXPLAIN is allowed when what it explains is a query.
        m = _EXPLAIN.match(sql)
        if m is None or m.group(1):
            raise QueryError("EXPLAIN ANALYZE is not allowed: it executes the statement")
        inner = _statements(con, sql[m.end() :])
        if len(inner) == 1 and inner[0].type in _READ_TYPES:
            return
        raise QueryError("only queries can be explained here")
    if kind not in _READ_TYPES:
        raise QueryError(f"read-only: {kind.name} statements are refused, only queries run here")


def run_query(run_dir: str | Path, sql: str) -> tuple[list[str], list[tuple]]:
    """Run one read-only query over the run's views; returns (column names, rows)."""
    try:
        con = connect(run_dir, read_only=True)
    except (FileNotFoundError, duckdb.Error) as e:
        raise QueryError(_one_line(e)) from None
    with con:
        check_read_only(con, sql)
        try:
            cur = con.execute(sql)
            columns = [d[0] for d in cur.description or []]
            rows = cur.fetchall()
        except duckdb.Error as e:
            raise QueryError(_one_line(e)) from None
    return columns, rows


def _cell(value: Any, width: int) -> str:
    if value is None:
        text = "NULL"
    elif isinstance(value, float):
        text = f"{value + 0.0:.6g}"  # + 0.0 turns -0.0 into 0
    elif isinstance(value, list | tuple) and len(value) > 8:
        head = ", ".join(_cell(v, width) for v in value[:6])
        text = f"[{head}, … ({len(value)} items)]"
    else:
        text = str(value)
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def format_table(columns: list[str], rows: list[tuple], max_rows: int = 50, cell_width: int = 60) -> str:
    """Rows as a rich table, at most max_rows of them, long cells (token lists, text) cut short."""
    cells = [[_cell(v, cell_width) for v in row] for row in rows[:max_rows]]
    table = Table(header_style="bold")
    for c in columns:
        table.add_column(c, overflow="fold")
    for row in cells:
        table.add_row(*row)
    # As wide as the content (cells are already cut), so rich never folds a header or a number.
    widths = [max([len(c)] + [len(r[i]) for r in cells]) + 3 for i, c in enumerate(columns)]
    out = io.StringIO()
    Console(file=out, width=max(40, sum(widths) + 1), force_terminal=False).print(table)
    more = f", {max_rows} shown" if len(rows) > max_rows else ""
    return out.getvalue() + f"({len(rows)} row{'s' if len(rows) != 1 else ''}{more})\n"


def read_query_file(file: str) -> str:
    """A query file: a path from here, else one of the shipped queries, named as in the repository
    (`sql/reports/reward_curve.sql`) or under sql/ (`reports/reward_curve`), from any folder."""
    from rao_core.store.sqlfiles import SQL_DIR

    here = Path(file)
    shipped = SQL_DIR / Path(file.removeprefix("sql/"))
    for path in (here, shipped, shipped.with_suffix(".sql")):
        if path.is_file():
            return path.read_text()
    raise QueryError(
        f"cannot read {file}: no such file here, nor a shipped query of that name under {SQL_DIR}"
    )


def format_records(columns: list[str], rows: list[tuple], max_rows: int = 50) -> str:
    """Rows one after another, every value whole (`rao sql --full`: a whole transcript, as stored)."""
    out = []
    for i, row in enumerate(rows[:max_rows]):
        out.append(f"-- row {i + 1} of {len(rows)} --")
        out += [
            f"{c}: {v}" if "\n" not in str(v) else f"{c}:\n{v}" for c, v in zip(columns, row, strict=True)
        ]
    return "\n".join(out) + "\n"


def sql_main(
    run_dir: str | Path, query: str | None, file: str | None, max_rows: int, full: bool = False
) -> int:
    """`rao sql`: print the result of a query (text or --file), as a table or, with `full`, every
    value whole; 0 on success, 2 on any refusal or error."""
    try:
        if (query is None) == (file is None):
            raise QueryError("give either a query or --file, not both")
        if file is not None:
            query = read_query_file(file)
        columns, rows = run_query(run_dir, query)
    except QueryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write((format_records if full else format_table)(columns, rows, max_rows=max_rows))
    return 0
