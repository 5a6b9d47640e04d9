"""RL scoring of one round: rewards, leave-one-out baselines, advantages and depth weights in SQL.

The equations (RAO Eq. 1, 3, 4) live in sql/*.sql and run in DuckDB over the round's Parquet node
file; this module binds the parameters, checks the input and writes the `scores` partition
atomically next to the rollouts. See docs/scoring.md for the equations and the edge-case settings.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from rao_core.config import ScoringConfig
from rao_core.layout import RunLayout
from rao_core.store.parquet import is_complete, partition_files, read_partition, write_partition
from rao_core.store.schema import SCORES_SCHEMA
from rao_core.store.sqlfiles import run_sql

# Run in this order in one connection: each file builds a temp table the next one reads; checks.sql
# runs after `trees` (it reads node_rewards and trees) and before anything is derived from them.
PIPELINE = ("node_rewards", "trees", "group_baselines", "depth_counts")

# Scores columns copied unchanged from the nodes file; advantages.sql computes the others. They are
# attached by position (advantages.sql keeps the file's row order), which is much cheaper than
# carrying the strings through DuckDB's joins: the SQL works on 64-bit keys of the ids.
ID_COLUMNS = ["run", "round", "task_id", "tree_id", "node_id", "parent_id", "depth"]


def _params(
    nodes_path: Path | list[Path], cfg: ScoringConfig, trained_version: int, max_staleness: int
) -> dict[str, Any]:
    if cfg.unfinished_roots not in ("keep", "drop"):
        raise ValueError(f"scoring.unfinished_roots: {cfg.unfinished_roots!r}")
    if cfg.single_tree_groups not in ("skip", "zero_baseline"):
        raise ValueError(f"scoring.single_tree_groups: {cfg.single_tree_groups!r}")
    if cfg.zero_advantage_groups not in ("skip", "keep"):
        raise ValueError(f"scoring.zero_advantage_groups: {cfg.zero_advantage_groups!r}")
    return {
        "nodes_path": [str(p) for p in nodes_path] if isinstance(nodes_path, list) else str(nodes_path),
        "lam": float(cfg.lam),
        "depth_weighting": bool(cfg.depth_weighting),
        "unfinished_roots": cfg.unfinished_roots,
        "single_tree_groups": cfg.single_tree_groups,
        "zero_advantage_groups": cfg.zero_advantage_groups,
        "trained_version": int(trained_version),
        "max_staleness": int(max_staleness),
    }


def score_nodes(
    nodes_path: str | Path | list[Path], cfg: ScoringConfig, trained_version: int = 0, max_staleness: int = 0
) -> pa.Table:
    """Score one round's node file (or the files of its shards, read as one table in list order);
    returns the scores table (rows in the nodes files' order). The round trains version
    `trained_version` (its round number); a tree sampled more than `max_staleness` versions before
    it is dropped as 'stale' (campaign.max_staleness).

    Raises ValueError when the trees are malformed (duplicate node ids, not exactly one root per
    tree, a tree spanning two task ids, children in another tree than their parent) or when two ids
    share a 64-bit hash key, since every baseline would silently be wrong otherwise.
    """
    path = nodes_path if isinstance(nodes_path, list) else Path(nodes_path)
    params = _params(path, cfg, trained_version, max_staleness)
    with duckdb.connect() as con:
        for name in PIPELINE:
            run_sql(con, name, params)
            if name == "trees":
                _check(con, nodes_path, params)
        computed = run_sql(con, "advantages", params).to_arrow_table()
    files = nodes_path if isinstance(nodes_path, list) else [nodes_path]
    ids = pa.concat_tables([pq.read_table(f, columns=ID_COLUMNS) for f in files])
    if ids.num_rows != computed.num_rows:  # cannot happen: both read every row of the same file
        raise RuntimeError(f"{nodes_path}: {ids.num_rows} id rows vs {computed.num_rows} scored rows")
    columns = {
        **{c: ids.column(c) for c in ID_COLUMNS},
        **{c: computed.column(c) for c in computed.column_names},
    }
    return pa.table([columns[name] for name in SCORES_SCHEMA.names], names=SCORES_SCHEMA.names).cast(
        SCORES_SCHEMA
    )


def _check(con: duckdb.DuckDBPyConnection, nodes_path: str | Path, params: dict[str, Any]) -> None:
    """checks.sql on the keys (cheap); on a problem, checks_named.sql names the ids (slow, rare)."""
    problems = [p for (p,) in run_sql(con, "checks", params).fetchall()]
    if not problems:
        return
    named = [p for (p,) in run_sql(con, "checks_named", params).fetchall()]
    if not named:  # the keys disagree but the strings do not: two ids share a hash
        named = [f"{p}; no id repeats, so two ids share a 64-bit hash key" for p in problems]
    raise ValueError(f"{nodes_path}: malformed trees: " + "; ".join(named))


def score_round(run_dir: str | Path, round: int, cfg: ScoringConfig, max_staleness: int = 0) -> Path:
    """Score `rollouts/round=N` into `scores/round=N` and return that partition's path; trees
    sampled more than `max_staleness` versions before version N are dropped ('stale').

    Idempotent: a complete scores partition is returned as is (scores are a pure function of the
    nodes and the config recorded in its marker), so a retried flow step costs nothing.
    """
    layout = RunLayout(Path(run_dir))
    dest = layout.scores(round)
    if is_complete(dest):
        return dest
    src = layout.rollouts(round)
    if not is_complete(src):
        raise FileNotFoundError(f"no complete rollouts partition at {src}")
    table = score_nodes(partition_files(src, "nodes"), cfg, round, max_staleness)
    meta = {"scoring": dataclasses.asdict(cfg), "max_staleness": max_staleness}
    try:
        return write_partition({"scores": table}, dest, meta=meta)
    except FileExistsError:  # a concurrent scorer finished first: same inputs, same result
        return dest


def scores_summary(run_dir: str | Path, round: int) -> dict[str, Any]:
    """Figures of one scored round for logging (MLflow): counts, drops, means, N_d and w_d."""
    scores = read_partition(RunLayout(Path(run_dir)).scores(round), "scores")
    if "staleness" not in scores.column_names:  # scored before rounds could overlap: all fresh
        scores = scores.append_column("staleness", pa.array([0] * scores.num_rows, pa.int32()))
    with duckdb.connect() as con:
        con.register("scores", scores)
        totals = run_sql(con, "summary_totals").fetchall()[0]
        drops = run_sql(con, "summary_drops").fetchall()
        depths = run_sql(con, "summary_depths").fetchall()
        groups = run_sql(con, "summary_groups").fetchall()[0]
        staleness = run_sql(con, "summary_staleness").fetchall()
    nodes, trained, trees, mean_reward, mean_adv, mean_root_reward = totals
    return {
        "round": round,
        "nodes": nodes,
        "trained_nodes": trained,
        "trees": trees,
        "dropped_trees": {reason: n for reason, n in drops},
        "mean_reward": mean_reward,
        "mean_root_reward": mean_root_reward,
        "mean_advantage_trained": mean_adv,
        "n_d": {d: n for d, n, _ in depths},
        "w_d": {d: w for d, _, w in depths},
        "groups": dict(zip(GROUP_KINDS, groups, strict=True)),
        "staleness": {k: {"nodes": n, "trained_nodes": t} for k, n, t in staleness},
    }


# The columns of sql/summary_groups.sql: the round's groups by what RL can learn from them.
GROUP_KINDS = ("groups", "spread", "all_failed", "all_succeeded", "no_spread", "no_valid")


def no_signal(groups: dict[str, int]) -> str | None:
    """Why a round's groups give RL nothing to learn from, or None when some group has spread."""
    if groups["spread"]:
        return None
    why = [f"{groups[k]} {k.replace('_', ' ')}" for k in GROUP_KINDS[2:] if groups[k]]
    return f"no group of {groups['groups']} has spread ({', '.join(why) or 'no groups'})"
