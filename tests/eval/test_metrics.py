"""Metrics against hand-computed cases."""

import pytest

from rao_core.eval.metrics import paired_bootstrap, per_task_success, tree_metrics, wilson_interval
from rao_core.run import Run
from rao_core.stages.evaluate import evaluate
from rao_core.store.parquet import read_partition


def node(tree, path, parent, depth, success, difficulty="easy", children=0, start=0.0, end=1.0, turns=2):
    return {
        "tree_id": tree, "node_id": f"{tree}:{path}", "parent_id": parent, "depth": depth, "success": success,
        "difficulty": difficulty, "children": children, "started_at": start, "ended_at": end, "turns": turns,
        "prompt_tokens": 10, "action_tokens": 5,
    }  # fmt: skip


def test_tree_metrics_by_hand():
    rows = [
        node("a", "0", None, 0, 1.0, children=2, end=4.0),
        node("a", "0.1", "a:0", 1, 1.0, start=1.0, end=2.0),
        node("a", "0.2", "a:0", 1, 0.0, start=1.0, end=3.0),
        node("b", "0", None, 0, 0.0, difficulty="medium"),
        node("c", "0", None, 0, 1.0, difficulty="medium", children=1),
        node("c", "0.1", "c:0", 1, 1.0),
    ]
    m = tree_metrics(rows)
    assert m["all"]["trees"] == 3 and m["all"]["success"] == pytest.approx(2 / 3)
    assert (
        m["easy"]["nodes_per_tree"] == 3
        and m["easy"]["max_depth"] == 1
        and m["easy"]["seconds_per_tree"] == 4.0
    )
    assert m["medium"]["success"] == 0.5 and m["medium"]["nodes_per_tree"] == 1.5
    assert m["medium"]["mean_max_depth"] == 0.5 and m["medium"]["root_delegation_rate"] == 0.5
    assert m["all"]["tokens_per_tree"] == 30.0 and m["all"]["turns_per_tree"] == 4.0
    assert m["success_by_depth"] == {"0": pytest.approx(2 / 3), "1": pytest.approx(2 / 3)}
    assert m["delegation_rate"] == pytest.approx(2 / 6)


def test_wilson_interval():
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


def test_evaluate_writes_partition_and_summary(toy):
    cfg = toy("eval.num_tasks=2", "eval.difficulty=easy,medium", "policy.error_rate=0")
    m = evaluate(Run(cfg), 0)
    assert m["easy"]["trees"] == 2 and m["medium"]["trees"] == 2
    assert (cfg.layout.eval(0) / "summary.json").is_file()
    assert evaluate(Run(cfg), 0) == m  # idempotent


def test_sampled_evaluation_rolls_out_k_trees_per_task(toy):
    """eval.samples k at temperature > 0: k trees of each held-out task, success is their mean."""
    cfg = toy("eval.num_tasks=2", "eval.difficulty=easy", "eval.samples=3", "eval.temperature=1")
    m = evaluate(Run(cfg), 0)
    rows = read_partition(cfg.layout.eval(0), "nodes").to_pylist()
    roots = [r for r in rows if r["parent_id"] is None]
    assert m["easy"]["trees"] == 6 and len({r["task_id"] for r in roots}) == 2
    assert sorted(r["sample"] for r in roots) == [0, 0, 1, 1, 2, 2]
    assert m["easy"]["success"] == pytest.approx(sum(r["success"] for r in roots) / 6)


def test_per_task_success_and_paired_bootstrap():
    rows = [  # task t1: two samples (root success 1, then 0 with a successful child); t2: one
        {**node("a0", "0", None, 0, 1.0), "task_id": "t1"},
        {**node("a1", "0", None, 0, 0.0), "task_id": "t1"},
        {**node("a1", "0.1", "a1:0", 1, 1.0), "task_id": "t1"},
        {**node("b0", "0", None, 0, 1.0), "task_id": "t2"},
    ]
    assert per_task_success(rows) == {"t1": 0.5, "t2": 1.0}  # roots only, mean over samples
    assert paired_bootstrap([0.25] * 10) == (0.25, 0.25)  # no spread, no interval
    diffs = [1.0, 0.0, 0.5, -0.5, 0.25, 0.75, 0.0, 1.0]
    lo, hi = paired_bootstrap(diffs)
    mean = sum(diffs) / len(diffs)
    assert -0.5 <= lo < mean < hi <= 1.0
    assert paired_bootstrap(diffs) == (lo, hi)  # seeded
