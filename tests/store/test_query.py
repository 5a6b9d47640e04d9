"""rao_core.query: `rao sql` runs one read-only query over a run and prints a readable table."""

from __future__ import annotations

import random
import re

import pytest

from rao_core.config import ScoringConfig
from rao_core.query import QueryError, format_table, run_query, sql_main
from rao_core.scoring import score_round
from rao_core.store.sqlfiles import SQL_DIR
from tests.store.forest import node_table, random_forest, write_round


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    for r in range(2):
        write_round(run, r, node_table(random_forest(random.Random(r), n_tasks=4), round=r))
        score_round(run, r, ScoringConfig(lam=0.4))
    return run


def test_select_returns_columns_and_rows(run_dir):
    cols, rows = run_query(run_dir, "SELECT round, count(*) AS n FROM nodes GROUP BY round ORDER BY round")
    assert cols == ["round", "n"]
    assert [r for r, _ in rows] == [0, 1]


@pytest.mark.parametrize(
    "sql",
    [
        "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
        "FROM scores LIMIT 1",
        "DESCRIBE samples",
        "SHOW TABLES",
        "EXPLAIN SELECT * FROM nodes",
        "SUMMARIZE scores",
    ],
)
def test_read_statements_are_allowed(run_dir, sql):
    cols, _ = run_query(run_dir, sql)
    assert cols


@pytest.mark.parametrize(
    "sql, words",
    [
        ("INSERT INTO nodes SELECT * FROM nodes", "INSERT"),
        ("CREATE TABLE t AS SELECT 1", "CREATE"),
        ("COPY scores TO 'out.csv'", "COPY"),
        ("SET threads = 1", "SET"),
        ("ATTACH 'other.duckdb'", "ATTACH"),
        ("PRAGMA enable_profiling", "PRAGMA"),
        ("CALL pragma_version()", "CALL"),
        ("DROP VIEW nodes", "DROP"),
        ("EXPLAIN ANALYZE SELECT 1", "EXPLAIN ANALYZE"),
        ("EXPLAIN COPY scores TO 'out.csv'", "only queries"),
        ("SELECT 1; SELECT 2", "exactly one statement"),
        ("", "exactly one statement"),
    ],
)
def test_other_statements_are_refused(run_dir, sql, words):
    with pytest.raises(QueryError, match=words):
        run_query(run_dir, sql)
    assert not (run_dir / "out.csv").exists()


def test_reading_other_files_is_refused(run_dir, tmp_path):
    (tmp_path / "secret.csv").write_text("a\n1\n")
    with pytest.raises(QueryError, match="Permission Error"):
        run_query(run_dir, f"SELECT * FROM read_csv('{tmp_path / 'secret.csv'}')")


@pytest.mark.parametrize(
    "sql, prefix",
    [
        ("SELECT FROM WHERE", "Parser Error"),
        ("SELECT * FROM nope", "Catalog Error"),
        ("SELECT 1 +", "Parser Error"),
    ],
)
def test_bad_sql_gives_duckdb_message_on_one_line(run_dir, sql, prefix):
    with pytest.raises(QueryError) as err:
        run_query(run_dir, sql)
    assert str(err.value).startswith(prefix) and "\n" not in str(err.value)


def test_sql_main_prints_table(run_dir, capsys):
    assert (
        sql_main(str(run_dir), "SELECT depth, count(*) AS n FROM scores GROUP BY 1 ORDER BY 1", None, 50) == 0
    )
    out = capsys.readouterr().out
    assert "depth" in out and re.search(r"\(\d+ rows?\)", out)


def test_sql_main_errors_are_one_line_without_traceback(run_dir, capsys):
    assert sql_main(str(run_dir), "DELETE FROM nodes", None, 50) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert sql_main(str(run_dir / "missing"), "SELECT 1", None, 50) == 2
    assert capsys.readouterr().err.startswith("error: no run folder")
    assert sql_main(str(run_dir), "SELECT 1", str(run_dir / "missing.sql"), 50) == 2
    assert sql_main(str(run_dir), None, str(run_dir / "missing.sql"), 50) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("report", sorted(p.name for p in (SQL_DIR / "reports").glob("*.sql")))
def test_report_queries_run(run_dir, report, capsys):
    assert sql_main(str(run_dir), None, str(SQL_DIR / "reports" / report), 5) == 0
    assert re.search(r"\(\d+ rows?[,)]", capsys.readouterr().out)


def test_format_table_cuts_long_cells_and_rows():
    rows = [(i, list(range(500)), "x" * 300, None, 1 / 3) for i in range(80)]
    text = format_table(["i", "tokens", "text", "none", "f"], rows, max_rows=10)
    assert "(80 rows, 10 shown)" in text
    assert "(500 items)" in text and "x" * 100 not in text
    assert "NULL" in text and "0.333333" in text
    assert len(text.splitlines()) < 20


def test_shipped_query_files_are_found_from_any_folder(tmp_path, monkeypatch):
    """`rao sql --file sql/reports/...` works outside the repository root too."""
    from rao_core.query import QueryError, read_query_file
    from rao_core.store.sqlfiles import SQL_DIR

    want = (SQL_DIR / "reports" / "reward_curve.sql").read_text()
    monkeypatch.chdir(tmp_path)
    assert read_query_file("sql/reports/reward_curve.sql") == want == read_query_file("reports/reward_curve")
    (tmp_path / "mine.sql").write_text("SELECT 1")
    assert read_query_file("mine.sql") == "SELECT 1"
    with pytest.raises(QueryError, match="no such file here"):
        read_query_file("sql/reports/nope.sql")


def test_rao_sql_finds_the_run_of_a_config_and_prints_whole_values(run_dir, tmp_path, capsys):
    """`rao sql --config FILE` queries that file's run (runs_dir/run_name); `--full` prints every
    value whole, a transcript as stored."""
    import shutil

    from flows.cli import main

    shutil.copytree(run_dir, tmp_path / "runs" / "mine")
    (tmp_path / "run.yaml").write_text(f"run_name: mine\nruns_dir: {tmp_path / 'runs'}\n")
    sql = "select string_agg(node_id, chr(10) order by node_id) as transcript from nodes"  # long, many lines
    assert main(["sql", sql, "--config", str(tmp_path / "run.yaml"), "--full"]) == 0
    out = capsys.readouterr().out
    whole = run_query(run_dir, sql)[1][0][0]
    assert out.startswith("-- row 1 of 1 --\ntranscript:") and whole in out and "…" not in out
