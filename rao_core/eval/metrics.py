"""Metrics of a set of trees, from the node table: plain Python over rows, so they are easy to
check by hand (tests/eval compares them with hand-computed cases); the summaries of a rollout and
of an evaluation partition."""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from rao_core.errors import is_scorer_failure
from rao_core.layout import RunLayout
from rao_core.store.files import write_json
from rao_core.store.parquet import read_partition


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (sensible at 0% and 100% with few trees)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def tree_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Success (root s), nodes, depth, turns, tokens and wall-clock per tree, by difficulty and overall."""
    trees: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        trees[r["tree_id"]].append(r)
    per_tree = []
    for nodes in trees.values():
        root = next(n for n in nodes if n["parent_id"] is None)
        per_tree.append(
            {
                "difficulty": root["difficulty"],
                "success": root["success"],
                "nodes": len(nodes),
                "max_depth": max(n["depth"] for n in nodes),
                "turns": sum(n["turns"] for n in nodes),
                "tokens": sum(n["prompt_tokens"] + n["action_tokens"] for n in nodes),
                "seconds": max(n["ended_at"] for n in nodes) - min(n["started_at"] for n in nodes),
                "delegated": root["children"] > 0,
            }
        )
    out: dict[str, Any] = {"all": _summary(per_tree)}
    for diff in sorted({t["difficulty"] for t in per_tree}):
        out[diff] = _summary([t for t in per_tree if t["difficulty"] == diff])
    by_depth: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        by_depth[r["depth"]].append(r["success"])
    out["success_by_depth"] = {str(d): sum(v) / len(v) for d, v in sorted(by_depth.items())}  # JSON keys
    out["delegation_rate"] = sum(r["children"] > 0 for r in rows) / max(1, len(rows))
    return out


def _summary(trees: list[dict]) -> dict[str, float]:
    n = len(trees)
    if n == 0:
        return {"trees": 0}
    wins = sum(t["success"] for t in trees)
    lo, hi = wilson_interval(wins, n)
    mean = lambda key: sum(t[key] for t in trees) / n  # noqa: E731
    return {
        "trees": n,
        "success": wins / n,
        "success_ci_low": lo,
        "success_ci_high": hi,
        "nodes_per_tree": mean("nodes"),
        "mean_max_depth": mean("max_depth"),
        "max_depth": max(t["max_depth"] for t in trees),
        "turns_per_tree": mean("turns"),
        "tokens_per_tree": mean("tokens"),
        "seconds_per_tree": mean("seconds"),
        "root_delegation_rate": mean("delegated"),
    }


def per_task_success(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean root success per task (over its samples): the unit of a paired comparison."""
    wins: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["parent_id"] is None:
            wins[r["task_id"]].append(r["success"])
    return {task: sum(v) / len(v) for task, v in wins.items()}


def paired_bootstrap(diffs: list[float], draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of per-task differences (tasks resampled)."""
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def summarize(table: pa.Table) -> dict:
    """Headline figures of one rollout partition, for the CLI, the round's log line and tracking."""
    rows = table.select(
        ["tree_id", "depth", "status", "tree_status", "success", "turns", "children", "started_at", "ended_at",
         "finish_message"]
    ).to_pylist()  # fmt: skip
    roots = [r for r in rows if r["depth"] == 0]
    by_depth: dict[int, list[float]] = {}
    for r in rows:
        by_depth.setdefault(r["depth"], []).append(r["success"])
    span = max(r["ended_at"] for r in rows) - min(r["started_at"] for r in rows) if rows else 0.0
    infra = [r for r in rows if r["status"] == "infra_error"]
    unsolved = [r for r in rows if r["status"] != "infra_error" and r["success"] < 1]
    return {
        "trees": len(roots),
        "nodes": len(rows),
        "infra_failed_nodes": len(infra),
        # of those, nodes whose scorer broke the reward contract (envs/base.py success_value)
        "scorer_failed_nodes": sum(is_scorer_failure(r["status"], r["finish_message"]) for r in infra),
        "infra_failed_trees": len({r["tree_id"] for r in rows if r["tree_status"] == "infra_error"}),
        # the policy's failures, by how the node ended ("finished": it answered, and scored below 1)
        "policy_failed_nodes": dict(Counter(r["status"] for r in unsolved)),
        "root_success": sum(r["success"] for r in roots) / max(1, len(roots)),
        "nodes_per_tree": len(rows) / max(1, len(roots)),
        "max_depth": max((r["depth"] for r in rows), default=0),
        "delegation_rate": sum(r["children"] > 0 for r in rows) / max(1, len(rows)),
        "success_by_depth": {d: sum(v) / len(v) for d, v in sorted(by_depth.items())},
        "statuses": dict(Counter(r["status"] for r in rows)),
        "node_turns": sum(r["turns"] for r in rows),
        "wall_seconds": span,
    }


def scorer_failures(dest: Path) -> tuple[int, int, str]:
    """(nodes whose scorer broke the reward contract, nodes, the first such node and its message)
    of a complete partition (envs/base.py success_value; `scorer:` is its failure kind)."""
    rows = read_partition(dest, "nodes").select(["node_id", "status", "finish_message"]).to_pylist()
    failed = [r for r in rows if is_scorer_failure(r["status"], r["finish_message"])]
    first = (
        f"node {failed[0]['node_id']}: {failed[0]['finish_message'].removeprefix('scorer: ')}"
        if failed
        else ""
    )
    return len(failed), len(rows), first


def load_round(layout: RunLayout, round_: int) -> pa.Table:
    """The nodes of training round `round_`."""
    return read_partition(layout.rollouts(round_), "nodes")


def summarize_eval(dest: Path) -> dict[str, Any]:
    """An evaluation partition's tree metrics, computed once and kept as its summary.json."""
    summary_path = dest / "summary.json"
    if summary_path.is_file():
        return json.loads(summary_path.read_text())
    metrics = tree_metrics(read_partition(dest, "nodes").to_pylist())
    write_json(summary_path, metrics)
    return metrics
