"""The held-out gain (paired by task) and the rollout budget, checked against plain-Python
references on random data, with the edge cases: tasks only one version has, several trees per
task, no shared tasks, no change."""

from __future__ import annotations

import random

import pytest

from rao_core.eval.gains import delegation_by_round, gain_line, paired_gain, rollout_budget, run_gain
from rao_core.eval.metrics import paired_bootstrap
from rao_core.eval.report import budget_markdown, delegation_markdown, gain_markdown
from tests.store.forest import node_table, random_forest, write_round


def roots(rng: random.Random, tasks: list[str], samples: int) -> list[dict]:
    rows = []
    for t in tasks:
        for s in range(samples):
            rows.append({"task_id": t, "difficulty": "hard" if t < "t5" else "medium", "parent_id": None,
                         "success": float(rng.random() < 0.5), "tree_id": f"{t}/{s}"})  # fmt: skip
            rows.append({"task_id": t, "difficulty": "x", "parent_id": f"{t}/{s}", "success": 1.0})  # a child
    return rows


@pytest.mark.parametrize("seed", range(20))
def test_paired_gain_matches_a_plain_reference(seed):
    rng = random.Random(seed)
    tasks = [f"t{i}" for i in range(rng.randint(1, 12))]
    only_first, only_last = (
        [f"a{i}" for i in range(rng.randint(0, 2))],
        [f"z{i}" for i in range(rng.randint(0, 2))],
    )
    k = rng.randint(1, 3)
    first, last = roots(rng, tasks + only_first, k), roots(rng, tasks + only_last, k)
    got = paired_gain(first, last)

    def mean_root(rows, task):  # the reference: by hand, task by task
        wins = [r["success"] for r in rows if r["task_id"] == task and r["parent_id"] is None]
        return sum(wins) / len(wins)

    for name in ["all", "hard", "medium"]:
        chosen = sorted(t for t in tasks if name == "all" or (name == "hard") == (t < "t5"))
        if not chosen:
            assert name not in got
            continue
        diffs = [mean_root(last, t) - mean_root(first, t) for t in chosen]
        g = got[name]
        assert g["tasks"] == len(chosen)
        assert g["first"] == pytest.approx(sum(mean_root(first, t) for t in chosen) / len(chosen))
        assert g["last"] == pytest.approx(sum(mean_root(last, t) for t in chosen) / len(chosen))
        assert g["gain"] == pytest.approx(sum(diffs) / len(diffs))
        assert (g["better"], g["worse"]) == (sum(d > 0 for d in diffs), sum(d < 0 for d in diffs))
        assert (g["ci_low"], g["ci_high"]) == paired_bootstrap(diffs)
        assert g["ci_low"] <= g["gain"] <= g["ci_high"]
    assert "x" not in got  # children never count


def test_paired_gain_edges():
    rng = random.Random(0)
    assert paired_gain(roots(rng, ["t1"], 1), roots(rng, ["t2"], 1)) == {}  # nothing shared
    same = roots(rng, ["t1", "t2", "t7"], 2)
    g = paired_gain(same, same)["all"]
    assert (g["gain"], g["ci_low"], g["ci_high"], g["better"], g["worse"]) == (0, 0, 0, 0, 0)


def test_run_gain_reads_the_evaluations(tmp_path):
    from rao_core.store.parquet import write_partition

    assert run_gain(tmp_path) is None  # no evaluation yet
    rng = random.Random(1)
    for v, p in enumerate((0.2, 0.5, 0.9)):
        cols = {"task_id": [], "tree_id": [], "node_id": [], "parent_id": [], "depth": [], "success": []}
        for t in range(30):
            cols["task_id"].append(f"t{t}")
            cols["tree_id"].append(f"t{t}/0")
            cols["node_id"].append(f"t{t}/0:0")
            cols["parent_id"].append(None)
            cols["depth"].append(0)
            cols["success"].append(float(rng.random() < p))
        cols["difficulty"] = ["hard"] * 30
        write_partition({"nodes": node_table(cols, round=v)}, tmp_path / "eval" / f"version={v}")
        if v == 0:
            assert run_gain(tmp_path) is None  # one version: nothing to compare
    g = run_gain(tmp_path)
    assert (g["first"], g["last"]) == (0, 2) and g["by"]["all"]["gain"] > 0.3
    assert run_gain(tmp_path, 0, 1)["last"] == 1
    line = gain_line("r", g)
    assert line.startswith("r held-out gain v0 -> v2") and "hard +" in line and "30 tasks" in line
    table = gain_markdown({"recursive": g})
    assert "| recursive v0 -> v2 | hard | 30 |" in table and "| recursive v0 -> v2 | all | 30 |" in table


def test_rollout_budget_matches_a_plain_reference(tmp_path):
    rng = random.Random(2)
    expected = []
    for r in range(3):
        cols = random_forest(rng, n_tasks=4, group_size=3)
        n = len(cols["node_id"])
        cols["action_tokens"] = [rng.randint(1, 50) for _ in range(n)]
        cols["prompt_tokens"] = [rng.randint(10, 500) for _ in range(n)]
        cols["started_at"] = [100.0 * r + rng.random() for _ in range(n)]
        cols["ended_at"] = [s + rng.uniform(1, 30) for s in cols["started_at"]]
        cols["success"] = [float(rng.random() < 0.5) for _ in range(n)]
        write_round(tmp_path, r, node_table(cols, round=r))
        root = [s for s, p in zip(cols["success"], cols["parent_id"], strict=True) if p is None]
        expected.append(
            {"round": r, "trees": len(set(cols["tree_id"])), "nodes": n,
             "sampled_tokens": sum(cols["action_tokens"]), "prompt_tokens": sum(cols["prompt_tokens"]),
             "seconds": round(max(cols["ended_at"]) - min(cols["started_at"]), 1),
             "root_success": round(sum(root) / len(root), 3)}
        )  # fmt: skip
    got = rollout_budget(tmp_path)
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert {k: row[k] for k in want} == pytest.approx(want, abs=0.051)  # sums exact; rounding
    table = budget_markdown({"single": got})
    assert f"| single | 3 | 36 | {sum(e['nodes'] for e in expected)} |" in table


def test_plot_runs_draws_one_line_per_run(tmp_path):
    import matplotlib.image

    from rao_core.eval.metrics import _summary
    from rao_core.eval.report import plot_runs

    def history(rates):
        return {v: {"all": _summary([{"success": float(i < 10 * r), "nodes": 1, "max_depth": 0, "turns": 1,
                                      "tokens": 1, "seconds": 1, "delegated": False} for i in range(10)])}
                for v, r in enumerate(rates)}  # fmt: skip

    out = plot_runs({"a": history([0.5, 0.6]), "b": history([0.5, 0.7, 0.8])}, tmp_path / "runs.png")
    image = matplotlib.image.imread(out)
    assert image.shape[0] > 100 and image.std() > 0.05  # a drawing, not a blank canvas


def test_delegation_by_round_matches_a_plain_reference(tmp_path):
    rng = random.Random(3)
    expected = []
    for r in range(3):
        cols = random_forest(rng, n_tasks=5, group_size=3, p_child=0.3 * r)  # round 0: no children
        cols["policy_version"] = [r] * len(cols["node_id"])
        cols["success"] = [float(rng.random() < 0.5) for _ in cols["node_id"]]
        write_round(tmp_path, r, node_table(cols, round=r))
        trees: dict[str, list[int]] = {}
        for i, tree in enumerate(cols["tree_id"]):
            trees.setdefault(tree, []).append(i)
        root_of = {t: next(i for i in ix if cols["parent_id"][i] is None) for t, ix in trees.items()}
        delegated = [
            any(cols["parent_id"][i] == cols["node_id"][root_of[t]] for i in ix) for t, ix in trees.items()
        ]
        expected.append(
            {"round": r, "policy_version": r, "trees": len(trees),
             "root_delegation_rate": sum(delegated) / len(trees),
             "mean_max_depth": sum(max(cols["depth"][i] for i in ix) for ix in trees.values()) / len(trees),
             "root_success": sum(cols["success"][root_of[t]] for t in trees) / len(trees)}
        )  # fmt: skip
    got = delegation_by_round(tmp_path)
    assert got[0]["root_delegation_rate"] == 0 and got[0]["mean_max_depth"] == 0  # no children
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, abs=0.0051)  # rounded to 3 places
    table = delegation_markdown({"recursive": {}}, {"recursive": got})
    assert f"| recursive | v2 |  |  |  | {100 * expected[2]['root_delegation_rate']:.0f}% |" in table


def test_plot_delegation_draws_both_panels(tmp_path):
    import matplotlib.image

    from rao_core.eval.metrics import _summary
    from rao_core.eval.report import plot_delegation

    def summary(rate):
        return {"all": _summary([{"success": 1.0, "nodes": 1, "max_depth": int(i < 10 * rate), "turns": 1,
                                  "tokens": 1, "seconds": 1, "delegated": i < 10 * rate} for i in range(10)])}  # fmt: skip

    arms = {"recursive": {0: summary(0.1), 1: summary(0.6)}}
    rows = [{"policy_version": 0, "root_delegation_rate": 0.2, "mean_max_depth": 0.3, "root_success": 0.4}]
    image = matplotlib.image.imread(plot_delegation(arms, {"recursive": rows}, tmp_path / "d.png"))
    assert image.shape[1] > image.shape[0] and image.std() > 0.05  # two panels side by side, drawn
    assert "| recursive | v1 | 60% | 0.60 | 100% |  |  |  |" in delegation_markdown(arms, {})
