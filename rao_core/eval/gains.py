"""What RL changed: held-out gain between two policy versions, paired by task, what each arm's
rollouts spent, and how often they delegated. Reads the campaign's own evaluations (the same tasks
for every version) and the rollout store; no new rollouts.

A greedy evaluation moves in steps of one task, and one round can move it either way; pairing
by task removes the between-task spread, so the interval is the honest "did it improve".
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from rao_core.eval.metrics import paired_bootstrap, per_task_success
from rao_core.eval.report import difficulties
from rao_core.layout import RunLayout
from rao_core.store.db import connect
from rao_core.store.parquet import read_partition
from rao_core.store.sqlfiles import run_sql


def paired_gain(first: list[dict[str, Any]], last: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per difficulty and "all": success of both versions on the tasks they share, the mean
    per-task difference with its 95% paired bootstrap interval, and how many tasks got better/worse."""
    a, b = per_task_success(first), per_task_success(last)
    difficulty = {r["task_id"]: r["difficulty"] for r in first if r["parent_id"] is None}
    shared = sorted(set(a) & set(b))
    groups: dict[str, list[str]] = defaultdict(list)
    for t in shared:
        groups[difficulty[t]].append(t)
    groups["all"] = shared
    out = {}
    for name, tasks in groups.items():
        if not tasks:
            continue
        diffs = [b[t] - a[t] for t in tasks]
        lo, hi = paired_bootstrap(diffs)
        out[name] = {
            "tasks": len(tasks),
            "first": sum(a[t] for t in tasks) / len(tasks),
            "last": sum(b[t] for t in tasks) / len(tasks),
            "gain": sum(diffs) / len(diffs),
            "ci_low": lo,
            "ci_high": hi,
            "better": sum(d > 0 for d in diffs),
            "worse": sum(d < 0 for d in diffs),
        }
    return out


def run_gain(run_dir: Path, first: int = 0, last: int | None = None) -> dict[str, Any] | None:
    """paired_gain between evaluations `first` and `last` (default: the latest) of a run; None
    while fewer than two are complete."""
    run = RunLayout(Path(run_dir))
    done = run.evaluated_versions()
    last = done[-1] if last is None and done else last
    if last is None or first not in done or last not in done or last == first:
        return None
    rows = [read_partition(run.eval(v), "nodes").to_pylist() for v in (first, last)]
    by = paired_gain(*rows)
    return {"first": first, "last": last, "by": by} if by else None  # None: no task in common


def rollout_budget(run_dir: Path) -> list[dict[str, Any]]:
    """Per round: trees, nodes, sampled and prompt tokens, seconds (sql/reports/rollout_budget.sql)."""
    return _report_rows(run_dir, "reports/rollout_budget")


def delegation_by_round(run_dir: Path) -> list[dict[str, Any]]:
    """Per round of training rollouts: root delegation rate, mean deepest level, root success
    (sql/reports/delegation_by_round.sql)."""
    return _report_rows(run_dir, "reports/delegation_by_round")


def _report_rows(run_dir: Path, name: str) -> list[dict[str, Any]]:
    con = connect(run_dir)
    try:
        cur = run_sql(con, name)
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
    finally:
        con.close()


def gain_line(arm: str, gain: dict[str, Any]) -> str:
    """One line for logs and the terminal: the paired gain per difficulty, then over all tasks."""
    by = gain["by"]
    order = [*difficulties(by), "all"]
    cells = ", ".join(
        f"{d} {100 * by[d]['gain']:+.1f} [{100 * by[d]['ci_low']:+.1f}, {100 * by[d]['ci_high']:+.1f}]"
        for d in order
    )
    return (
        f"{arm} held-out gain v{gain['first']} -> v{gain['last']} in points, 95% paired interval over "
        f"{by['all']['tasks']} tasks: {cells}"
    )
