"""Benchmark: score ~1,000,000 synthetic nodes from Parquet in SQL vs the plain-Python reference.

    .venv/bin/python bench/score_bench.py [--nodes 1000000] [--seed 0] [--repeat 3]

Builds realistic trees (G = 8 trees per task, up to 3 children per node, depths up to 6), writes
them as a rollouts partition with NODE_SCHEMA, then runs each side in a fresh subprocess so each
peak RSS (ru_maxrss) is its own: `score_round` end to end (read Parquet, SQL, write the scores
partition) and the reference (read the same Parquet columns, plain-Python Eq. 1/3/4). Both sides
start from the same file; the reference does not even write its result, so the ratio is fair to it.
With --repeat N each side runs N times (alternating, the scores partition removed in between) and
the medians are compared, since a shared machine's timings vary by tens of percent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rao_core import interrupts  # noqa: E402
from rao_core.config import ScoringConfig  # noqa: E402

CFG = ScoringConfig(lam=0.4)
# The columns the reference needs (score_round's SQL reads the same ones).
REF_COLUMNS = "run round task_id tree_id node_id parent_id depth status tree_status success".split()


def build(run_dir: Path, target: int, seed: int) -> int:
    from tests.store.forest import node_table, random_forest, write_round

    rng = random.Random(seed)
    cols: dict[str, list] = {}
    t = 0
    while not cols or len(cols["node_id"]) < target:
        part = random_forest(
            rng, n_tasks=500, group_size=8, max_depth=6, max_children=3, p_child=0.9, p_timeout=0.03,
            p_unfinished=0.1, p_gap=0.0, p_zero_group=0.05, task_prefix=f"b{t}-",
        )  # fmt: skip
        for k, v in part.items():
            cols.setdefault(k, []).extend(v)
        t += 1
    write_round(run_dir, 0, node_table(cols, run="bench"))
    return len(cols["node_id"])


def run_sql_side(run_dir: Path) -> dict:
    from rao_core.scoring import score_round

    t0 = time.perf_counter()
    score_round(run_dir, 0, CFG)
    return {"seconds": time.perf_counter() - t0}


def run_reference_side(run_dir: Path) -> dict:
    import pyarrow.parquet as pq

    from tests.store.reference import reference_scores

    t0 = time.perf_counter()
    rows = pq.read_table(run_dir / "rollouts" / "round=0" / "nodes.parquet", columns=REF_COLUMNS).to_pylist()
    t_read = time.perf_counter() - t0
    reference_scores(rows, CFG)
    return {"seconds": time.perf_counter() - t0, "read_seconds": t_read}


def child(side: str, run_dir: Path) -> None:
    out = run_sql_side(run_dir) if side == "sql" else run_reference_side(run_dir)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def spawn(side: str, run_dir: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", side, "--run-dir", str(run_dir)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", choices=["sql", "ref"])
    ap.add_argument("--run-dir", type=Path)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.run_dir)
    runs: dict[str, list[dict]] = {"sql": [], "ref": []}
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "bench"
        t0 = time.perf_counter()
        n = build(run_dir, args.nodes, args.seed)
        size = (run_dir / "rollouts" / "round=0" / "nodes.parquet").stat().st_size / 2**20
        built = time.perf_counter() - t0
        print(f"built {n:,} nodes in {built:.1f} s ({size:.0f} MiB Parquet), {os.cpu_count()} CPUs")
        for _ in range(args.repeat):
            shutil.rmtree(run_dir / "scores", ignore_errors=True)
            runs["sql"].append(spawn("sql", run_dir))
            runs["ref"].append(spawn("ref", run_dir))

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    def each(side: str) -> str:
        return " ".join(f"{r['seconds']:.2f}" for r in runs[side])

    print(f"median of {args.repeat} runs each (every run: SQL {each('sql')} s; reference {each('ref')} s)")
    print(
        f"SQL score_round (read+score+write): {med('sql', 'seconds'):6.2f} s  peak RSS {med('sql', 'peak_rss_mb'):5.0f} MiB"
    )
    print(
        f"Python reference (read+score):      {med('ref', 'seconds'):6.2f} s  peak RSS {med('ref', 'peak_rss_mb'):5.0f} MiB"
    )
    print(f"  of which the reference's Parquet read into Python: {med('ref', 'read_seconds'):.2f} s")
    print(f"ratio reference / SQL: {med('ref', 'seconds') / med('sql', 'seconds'):.1f}x")


if __name__ == "__main__":
    interrupts.run_script(main)
