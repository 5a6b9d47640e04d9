"""rao_core.store.db: the run's views over complete partitions only, locked down when read-only."""

from __future__ import annotations

import random

import duckdb
import pyarrow.parquet as pq
import pytest

from rao_core.config import ScoringConfig
from rao_core.scoring import SCORES_SCHEMA, score_round
from rao_core.store.db import complete_files, connect
from rao_core.store.schema import NODE_SCHEMA
from tests.store.forest import node_table, random_forest, write_round

SAMPLE_COLUMNS = [
    "node_id", "round", "depth", "token_ids", "action_mask", "logprobs", "temperature",
    "advantage", "depth_weight", "weighted_advantage", "policy_version",
]  # fmt: skip


def columns(con: duckdb.DuckDBPyConnection, view: str) -> list[str]:
    return [d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description]


def make_run(tmp_path, rounds: int = 2, scored: int = 1):
    for r in range(rounds):
        cols = random_forest(random.Random(r), n_tasks=4, task_prefix=f"r{r}t")
        write_round(tmp_path, r, node_table(cols, round=r))
    for r in range(scored):
        score_round(tmp_path, r, ScoringConfig(lam=0.4))
    return tmp_path


def test_empty_run_has_every_view(tmp_path):
    con = connect(tmp_path)
    assert columns(con, "nodes") == NODE_SCHEMA.names
    assert columns(con, "scores") == SCORES_SCHEMA.names
    assert columns(con, "samples") == SAMPLE_COLUMNS
    for view in ("nodes", "scores", "samples"):
        assert con.execute(f"SELECT count(*) FROM {view}").fetchall() == [(0,)]


def test_views_cover_complete_partitions_only(tmp_path):
    make_run(tmp_path, rounds=2, scored=1)
    crashed = tmp_path / "rollouts" / "round=2"
    crashed.mkdir()
    pq.write_table(node_table(random_forest(random.Random(9)), round=2), crashed / "nodes.parquet")
    con = connect(tmp_path)
    assert [r for (r,) in con.execute("SELECT DISTINCT round FROM nodes ORDER BY 1").fetchall()] == [0, 1]
    assert con.execute("SELECT DISTINCT round FROM scores").fetchall() == [(0,)]
    n_nodes = con.execute("SELECT count(*) FROM nodes WHERE round = 0").fetchone()[0]
    assert con.execute("SELECT count(*) FROM scores").fetchone()[0] == n_nodes


def test_samples_are_trained_scored_nodes(tmp_path):
    make_run(tmp_path, rounds=2, scored=2)
    con = connect(tmp_path)
    assert columns(con, "samples") == SAMPLE_COLUMNS
    (n_trained,) = con.execute("SELECT count(*) FROM scores WHERE trained").fetchone()
    (n_samples,) = con.execute("SELECT count(*) FROM samples").fetchone()
    assert n_samples == n_trained > 0
    mismatched = con.execute(
        """SELECT count(*) FROM samples s JOIN scores c USING (round, node_id)
           WHERE s.weighted_advantage != c.weighted_advantage OR NOT c.trained"""
    ).fetchone()[0]
    assert mismatched == 0
    assert con.execute("SELECT token_ids FROM samples LIMIT 1").fetchone()[0] == [1, 2, 3, 4]


def test_rounds_sort_numerically(tmp_path):
    for r in (10, 9, 2):
        write_round(tmp_path, r, node_table(random_forest(random.Random(r)), round=r))
    names = [p.parent.name for p in complete_files(tmp_path, "rollouts", "nodes")]
    assert names == ["round=2", "round=9", "round=10"]


def test_read_only_connection_is_locked(tmp_path):
    make_run(tmp_path, rounds=1, scored=1)
    outside = tmp_path / "other.parquet"
    pq.write_table(node_table(random_forest(random.Random(1))), outside)
    con = connect(tmp_path)
    with pytest.raises(duckdb.PermissionException):
        con.execute("SELECT count(*) FROM read_parquet($p)", {"p": str(outside)}).fetchall()
    with pytest.raises(duckdb.PermissionException):
        con.execute("COPY (SELECT 1) TO $p", {"p": str(tmp_path / "x.csv")})
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET enable_external_access = true")
    assert not (tmp_path / "x.csv").exists()


def test_writable_connection_reads_other_files(tmp_path):
    make_run(tmp_path, rounds=1, scored=0)
    con = connect(tmp_path, read_only=False)
    con.execute("CREATE TEMP TABLE t AS SELECT count(*) AS n FROM nodes")
    assert con.execute("SELECT n > 0 FROM t").fetchone() == (True,)


def test_missing_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError):
        connect(tmp_path / "nope")
