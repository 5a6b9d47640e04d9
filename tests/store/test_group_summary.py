"""The round's groups by what RL can learn from them (sql/summary_groups.sql through
scores_summary), against a plain-Python count on random forests; and `no_signal`, the words of a
round that trains nothing."""

from __future__ import annotations

import random

import pytest

from rao_core.config import ScoringConfig
from rao_core.scoring import GROUP_KINDS, no_signal, score_round, scores_summary
from rao_core.store.parquet import read_partition
from tests.store.forest import node_table, random_forest, write_round


def reference_groups(scores: list[dict]) -> dict[str, int]:
    """Plain Python: a group has spread when some trained node has a nonzero advantage; otherwise
    its valid roots (not timed out, no infrastructure failure) say why."""
    by_task: dict[str, list[dict]] = {}
    for row in scores:
        by_task.setdefault(row["task_id"], []).append(row)
    out = dict.fromkeys(GROUP_KINDS, 0)
    for rows in by_task.values():
        out["groups"] += 1
        if any(r["trained"] and r["advantage"] != 0 for r in rows):
            out["spread"] += 1
            continue
        valid = [r["success"] for r in rows
                 if r["parent_id"] is None and r["drop_reason"] not in ("timeout", "infra_error")]  # fmt: skip
        if not valid:
            out["no_valid"] += 1
        elif max(valid) == 0:
            out["all_failed"] += 1
        elif min(valid) == 1:
            out["all_succeeded"] += 1
        else:
            out["no_spread"] += 1
    return out


@pytest.mark.parametrize("seed", range(12))
def test_group_kinds_match_a_plain_count(tmp_path, seed):
    rng = random.Random(seed)
    forest = random_forest(rng, n_tasks=rng.randint(1, 8), max_group=rng.choice([1, 2, 6]), p_zero_group=0.3)
    if seed % 3 == 0:  # groups where every root succeeds
        forest["success"] = [1.0] * len(forest["success"])
    write_round(tmp_path, 0, node_table(forest))
    cfg = ScoringConfig(zero_advantage_groups=rng.choice(["skip", "keep"]),
                        single_tree_groups=rng.choice(["skip", "zero_baseline"]))  # fmt: skip
    rows = read_partition(score_round(tmp_path, 0, cfg), "scores").to_pylist()
    got = scores_summary(tmp_path, 0)["groups"]
    assert got == reference_groups(rows)
    assert got["groups"] == sum(got[k] for k in GROUP_KINDS[1:])


def test_no_signal_says_why():
    assert (
        no_signal(
            {"groups": 8, "spread": 1, "all_failed": 7, "all_succeeded": 0, "no_spread": 0, "no_valid": 0}
        )
        is None
    )
    why = no_signal(
        {"groups": 8, "spread": 0, "all_failed": 0, "all_succeeded": 6, "no_spread": 2, "no_valid": 0}
    )
    assert why == "no group of 8 has spread (6 all succeeded, 2 no spread)"
