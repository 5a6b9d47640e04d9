"""Scoring in SQL (sql/*.sql via rao_core.scoring) against the plain-Python reference of Eq. 1/3/4."""

from __future__ import annotations

import itertools
import math
import random
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rao_core.config import ScoringConfig
from rao_core.scoring import SCORES_SCHEMA, score_round, scores_summary
from rao_core.store.parquet import MARKER, read_partition
from tests.store.forest import node_table, random_forest, write_round
from tests.store.reference import reference_scores

SETTINGS = list(itertools.product(("keep", "drop"), ("skip", "zero_baseline"), ("skip", "keep")))


def cfg_of(lam: float, dw: bool, combo: tuple[str, str, str]) -> ScoringConfig:
    u, s, z = combo
    return ScoringConfig(
        lam=lam, depth_weighting=dw, unfinished_roots=u, single_tree_groups=s, zero_advantage_groups=z
    )


def score_table(
    table: pa.Table, cfg: ScoringConfig, run_dir: Path | None = None, round: int = 0, max_staleness: int = 0
) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = run_dir or Path(tmp)
        write_round(run_dir, round, table)
        return read_partition(score_round(run_dir, round, cfg, max_staleness), "scores").to_pylist()


def assert_matches_reference(
    table: pa.Table, cfg: ScoringConfig, round: int = 0, max_staleness: int = 0
) -> list[dict]:
    got = score_table(table, cfg, round=round, max_staleness=max_staleness)
    want = reference_scores(table.to_pylist(), cfg, round, max_staleness)
    assert [r["node_id"] for r in got] == table.column("node_id").to_pylist()  # input order kept
    for row in got:
        ref = want[row["node_id"]]
        assert set(row) == set(ref) == set(SCORES_SCHEMA.names)
        for col, value in row.items():
            if isinstance(value, float) and ref[col] is not None:
                assert math.isclose(value, ref[col], rel_tol=0, abs_tol=1e-9), (col, row, ref)
            else:
                assert value == ref[col], (col, row, ref)
    assert_roots_sum_to_zero(got)
    return got


def assert_roots_sum_to_zero(rows: list[dict]) -> None:
    """Leave-one-out: sum_g (R_g - mean of the others) = 0 in every group of >= 2 valid trees."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r["parent_id"] is None and r["baseline"] is not None:
            groups.setdefault(r["task_id"], []).append(r["advantage"])
    for advs in groups.values():
        if len(advs) >= 2:
            assert abs(sum(advs)) < 1e-9


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rng=st.randoms(use_true_random=False),
    lam=st.sampled_from([0.0, 0.4, 1.0]) | st.floats(0.0, 2.0),
    dw=st.booleans(),
    combo=st.sampled_from(SETTINGS),
    n_tasks=st.integers(1, 4),
    max_group=st.integers(1, 6),
    max_depth=st.integers(0, 4),
    max_children=st.integers(0, 3),
)
def test_random_forests_match_reference(rng, lam, dw, combo, n_tasks, max_group, max_depth, max_children):
    cols = random_forest(
        rng, n_tasks=n_tasks, max_group=max_group, max_depth=max_depth, max_children=max_children, p_gap=0.1
    )
    assert_matches_reference(node_table(cols), cfg_of(lam, dw, combo))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rng=st.randoms(use_true_random=False),
    combo=st.sampled_from(SETTINGS),
    round=st.integers(0, 5),
    max_staleness=st.integers(0, 3),
    n_tasks=st.integers(1, 5),
)
def test_stale_trees_match_reference(rng, combo, round, max_staleness, n_tasks):
    """Trees sampled with versions 0..round (sometimes none): each row's staleness is round minus
    its policy_version, and a tree older than max_staleness is dropped as 'stale' before its group's
    baseline is taken (the other trees' baselines leave it out)."""
    cols = random_forest(rng, n_tasks=n_tasks, max_group=4, max_depth=2, max_version=round)
    got = assert_matches_reference(
        node_table(cols, round=round), cfg_of(0.4, True, combo), round, max_staleness
    )
    for row in got:
        assert 0 <= row["staleness"] <= round
        if row["staleness"] > max_staleness:  # the reference decides the rest
            assert row["drop_reason"] == "stale" and not row["trained"]


def test_stale_edge_cases():
    """One stale tree in a group of two leaves a single-tree group; a group of stale trees only;
    staleness exactly k is kept; rows with no version are fresh."""
    cols = {
        "task_id": ["a", "a", "b", "c", "c"],
        "tree_id": ["a/0", "a/1", "b/0", "c/0", "c/1"],
        "node_id": ["a/0:0", "a/1:0", "b/0:0", "c/0:0", "c/1:0"],
        "parent_id": [None] * 5,
        "depth": [0] * 5,
        "success": [1.0, 0.0, 1.0, 1.0, 0.0],
        "policy_version": [3, 1, 1, 2, None],
    }
    cfg = ScoringConfig(single_tree_groups="skip", zero_advantage_groups="keep")
    got = {r["tree_id"]: r for r in assert_matches_reference(node_table(cols, round=3), cfg, 3, 1)}
    assert got["a/1"]["drop_reason"] == got["b/0"]["drop_reason"] == "stale"
    assert got["a/0"]["drop_reason"] == "single_tree_group"  # its only peer was stale
    assert [got[t]["staleness"] for t in ("a/0", "a/1", "b/0", "c/0", "c/1")] == [0, 2, 2, 1, 0]
    assert got["c/0"]["trained"] and got["c/1"]["trained"] and got["c/0"]["baseline"] == 0.0


@pytest.mark.parametrize("combo", SETTINGS)
@pytest.mark.parametrize("dw", [True, False])
def test_every_setting_on_a_seeded_forest(combo, dw):
    rng = random.Random(SETTINGS.index(combo) * 2 + dw)
    table = node_table(random_forest(rng, n_tasks=8, p_timeout=0.25, p_unfinished=0.3, p_zero_group=0.3))
    got = assert_matches_reference(table, cfg_of(0.4, dw, combo))
    reasons = {r["drop_reason"] for r in got}
    assert "timeout" in reasons
    assert ("unfinished_root" in reasons) == (combo[0] == "drop")


def hand_forest() -> pa.Table:
    """Task a: 3 valid trees + 1 timed out; task b: one tree; task c: two all-zero trees."""
    rows = [  # (tree, node, parent, depth, success, status, tree_status)
        ("a/0", "a/0:0", None, 0, 1.0, "finished", "ok"),
        ("a/0", "a/0:0.0", "a/0:0", 1, 1.0, "finished", "ok"),
        ("a/0", "a/0:0.1", "a/0:0", 1, 0.0, "budget", "ok"),
        ("a/1", "a/1:0", None, 0, 0.0, "finished", "ok"),
        ("a/2", "a/2:0", None, 0, 0.5, "finished", "ok"),
        ("a/2", "a/2:0.0", "a/2:0", 1, 1.0, "finished", "ok"),
        ("a/2", "a/2:0.0.0", "a/2:0.0", 2, 0.0, "error", "ok"),
        ("a/3", "a/3:0", None, 0, 1.0, "finished", "timeout"),
        ("b/0", "b/0:0", None, 0, 1.0, "finished", "ok"),
        ("c/0", "c/0:0", None, 0, 0.0, "finished", "ok"),
        ("c/1", "c/1:0", None, 0, 0.0, "budget", "ok"),
    ]
    names = ("tree_id", "node_id", "parent_id", "depth", "success", "status", "tree_status")
    cols = {k: list(v) for k, v in zip(names, zip(*rows, strict=True), strict=True)}
    cols["task_id"] = [t.split("/")[0] for t in cols["tree_id"]]
    return node_table(cols)


def test_hand_computed_example():
    got = {r["node_id"]: r for r in score_table(hand_forest(), ScoringConfig(lam=0.5))}
    # Eq. 1: R(a/0 root) = 1 + 0.5 * mean(1, 0); R(a/2 root) = 0.5 + 0.5 * 1; R(a/2 child) = 1 + 0.5 * 0
    rewards = {"a/0:0": 1.25, "a/0:0.0": 1.0, "a/0:0.1": 0.0, "a/1:0": 0.0, "a/2:0": 1.0, "a/2:0.0": 1.0}
    for node, r in rewards.items():
        assert got[node]["reward"] == pytest.approx(r)
    # Eq. 3 over the valid trees a/0, a/1, a/2 (a/3 timed out): b_0 = (0 + 1) / 2, b_1 = (1.25 + 1) / 2, b_2 = (1.25 + 0) / 2
    baselines = {"a/0": 0.5, "a/1": 1.125, "a/2": 0.625}
    advantages = {"a/0:0": 0.75, "a/0:0.0": 0.5, "a/0:0.1": -0.5, "a/1:0": -1.125, "a/2:0": 0.375}
    advantages |= {"a/2:0.0": 0.375, "a/2:0.0.0": -0.625}
    # Eq. 4 over the 7 trained nodes: N = {0: 3, 1: 3, 2: 1}, alpha = 7 / 3
    w = {0: 7 / 9, 1: 7 / 9, 2: 7 / 3}
    for node, a in advantages.items():
        row = got[node]
        assert row["baseline"] == pytest.approx(baselines[row["tree_id"]])
        assert row["advantage"] == pytest.approx(a)
        assert row["depth_weight"] == pytest.approx(w[row["depth"]])
        assert row["weighted_advantage"] == pytest.approx(a * w[row["depth"]])
        assert row["trained"] and row["drop_reason"] is None
    assert sum(advantages[n] for n in ("a/0:0", "a/1:0", "a/2:0")) == pytest.approx(0.0)
    dropped = {"a/3:0": "timeout", "b/0:0": "single_tree_group", "c/0:0": "zero_advantage_group"}
    for node, reason in dropped.items():
        row = got[node]
        assert (row["trained"], row["drop_reason"], row["weighted_advantage"]) == (False, reason, 0.0)
        assert row["depth_weight"] == pytest.approx(w[0])  # untrained keep their depth's w
    assert got["a/3:0"]["baseline"] is None and got["a/3:0"]["advantage"] == 0.0
    assert got["c/0:0"]["baseline"] == 0.0


def test_hand_example_other_settings():
    cfg = ScoringConfig(
        lam=0.5, unfinished_roots="drop", single_tree_groups="zero_baseline", zero_advantage_groups="keep"
    )
    got = {r["node_id"]: r for r in score_table(hand_forest(), cfg)}
    assert got["b/0:0"]["baseline"] == 0.0 and got["b/0:0"]["advantage"] == 1.0 and got["b/0:0"]["trained"]
    assert got["c/1:0"]["drop_reason"] == "unfinished_root"  # its root ended on budget
    assert got["c/0:0"]["trained"]  # alone now: zero baseline, advantage 0, kept
    assert_matches_reference(hand_forest(), cfg)


def test_depth_gap_counts_only_present_depths():
    cols = {
        "task_id": ["a"] * 4,
        "tree_id": ["a/0", "a/0", "a/1", "a/1"],
        "node_id": ["a/0:0", "a/0:0.0", "a/1:0", "a/1:0.0"],
        "parent_id": [None, "a/0:0", None, "a/1:0"],
        "depth": [0, 2, 0, 2],
        "success": [1.0, 0.0, 0.0, 1.0],
    }
    got = score_table(node_table(cols), ScoringConfig())
    assert {r["depth_weight"] for r in got} == {1.0}  # alpha = 4 / 2 depths, N_0 = N_2 = 2


def test_depth_weighting_off_gives_one():
    got = score_table(hand_forest(), ScoringConfig(lam=0.5, depth_weighting=False))
    assert {r["depth_weight"] for r in got} == {1.0}
    assert all(r["weighted_advantage"] == (r["advantage"] if r["trained"] else 0.0) for r in got)


def test_idempotent_and_summary(tmp_path):
    write_round(tmp_path, 0, hand_forest())
    path = score_round(tmp_path, 0, ScoringConfig(lam=0.5))
    stamp = (path / MARKER).stat().st_mtime_ns
    assert score_round(tmp_path, 0, ScoringConfig(lam=0.0)) == path  # already complete: not recomputed
    assert (path / MARKER).stat().st_mtime_ns == stamp
    s = scores_summary(tmp_path, 0)
    assert (s["nodes"], s["trained_nodes"], s["trees"]) == (11, 7, 7)
    assert s["dropped_trees"] == {"single_tree_group": 1, "timeout": 1, "zero_advantage_group": 2}
    assert s["n_d"] == {0: 3, 1: 3, 2: 1}
    assert s["w_d"][2] == pytest.approx(7 / 3)
    assert s["mean_advantage_trained"] == pytest.approx(
        (0.75 + 0.5 - 0.5 - 1.125 + 0.375 + 0.375 - 0.625) / 7
    )


def test_missing_or_incomplete_rollouts(tmp_path):
    with pytest.raises(FileNotFoundError):
        score_round(tmp_path, 0, ScoringConfig())
    part = tmp_path / "rollouts" / "round=0"
    part.mkdir(parents=True)
    pq.write_table(hand_forest(), part / "nodes.parquet")  # no _COMPLETE marker: a crashed writer
    with pytest.raises(FileNotFoundError):
        score_round(tmp_path, 0, ScoringConfig())


@pytest.mark.parametrize("broken", ["two_roots", "no_root", "duplicate"])
def test_malformed_trees_are_refused(tmp_path, broken):
    cols = {
        "task_id": ["a"] * 3,
        "tree_id": ["a/0"] * 3,
        "node_id": ["a/0:0", "a/0:0.0", "a/0:0.1"],
        "parent_id": [None, "a/0:0", "a/0:0"],
        "depth": [0, 1, 1],
    }
    if broken == "two_roots":
        cols["parent_id"][2] = None
    elif broken == "no_root":
        cols["parent_id"][0] = "elsewhere"
    else:
        cols["node_id"][2] = "a/0:0.0"
    write_round(tmp_path, 0, node_table(cols))
    with pytest.raises(ValueError, match="malformed"):
        score_round(tmp_path, 0, ScoringConfig())


def test_bad_setting_is_refused(tmp_path):
    write_round(tmp_path, 0, hand_forest())
    with pytest.raises(ValueError, match="single_tree_groups"):
        score_round(tmp_path, 0, ScoringConfig(single_tree_groups="nope"))  # type: ignore[arg-type]


def test_window_over_hive_partition_filter_is_per_partition(tmp_path):
    """Regression guard for DuckDB 2.0.0/2.0.1 (stack-notes): with a WHERE on a hive-partition column,
    window functions aggregated over ALL partitions. Scoring avoids the pattern (it reads one
    round's file by path), but an upgrade to a buggy DuckDB must still fail here."""
    for rnd, values in ((0, [100.0, 200.0, 300.0]), (1, [1.0, 2.0, 4.0])):
        part = tmp_path / f"round={rnd}"
        part.mkdir()
        pq.write_table(pa.table({"task_id": ["t"] * 3, "reward": values}), part / "nodes.parquet")
    rows = duckdb.execute(
        """SELECT reward,
                  sum(reward) OVER (PARTITION BY task_id) AS total,
                  (sum(reward) OVER (PARTITION BY task_id) - reward) / (count(*) OVER (PARTITION BY task_id) - 1) AS loo
           FROM read_parquet($glob, hive_partitioning = true)
           WHERE round = 1
           ORDER BY reward""",
        {"glob": str(tmp_path / "round=*" / "*.parquet")},
    ).fetchall()
    assert rows == [(1.0, 7.0, 3.0), (2.0, 7.0, 2.5), (4.0, 7.0, 1.5)]
    assert sum(r - loo for r, _, loo in rows) == pytest.approx(0.0)


def test_tiny_nonzero_spread_is_still_trained():
    cols = {
        "task_id": ["a", "a"],
        "tree_id": ["a/0", "a/1"],
        "node_id": ["a/0:0", "a/1:0"],
        "parent_id": [None, None],
        "depth": [0, 0],
        "success": [0.5, 0.5 + 2**-20],  # float32; advantages of +-1e-6: small, not zero
    }
    got = score_table(node_table(cols), ScoringConfig())
    assert all(r["trained"] for r in got)
    assert got[1]["advantage"] == pytest.approx(2**-20, abs=1e-15)
