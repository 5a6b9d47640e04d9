"""Benchmark: the default campaign (`make run`'s settings) with rounds that overlap
(campaign.max_staleness = 1) against rounds in turn (k = 0), side by side on this machine (with
--set, another campaign: `scripts/gpu_check.sh` puts the engines and the trainer on two GPUs).

Each campaign is a fresh `rao train` in a folder of its own (its own temporary Prefect server,
MLflow store and engine processes), k = 0 first. Prints

    default campaign: k=0 A s, k=1 B s, ratio R, floor F

with R = B / A and F = the k = 0 run's CPU seconds (every process it started included) divided by
the cores, over A: how busy the cores already were without overlap, so the best ratio overlap
could reach on these cores. Then each run's held-out success table line.

    .venv/bin/python bench/overlap_bench.py [--rounds 12] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rao_core import interrupts

ROOT = Path(__file__).resolve().parents[1]


def campaign(runs_dir: Path, k: int, rounds: int, sets: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (this child and everything it started) and the last lines."""
    overrides = [f"runs_dir={runs_dir}", f"campaign.rounds={rounds}", f"campaign.max_staleness={k}", *sets]
    cmd = [sys.executable, "-m", "flows.cli", "train", *(a for o in overrides for a in ("--set", o))]
    env = {**os.environ, "PREFECT_HOME": str(runs_dir / ".prefect"), "HF_HUB_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"k={k}: rao train failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep", help="keep the run folders here instead of a temporary folder")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="rao-overlap-") as tmp:
        where = Path(args.keep or tmp)
        a, cpu_a, out_a = campaign(where / "k0", 0, args.rounds, args.sets)
        b, cpu_b, out_b = campaign(where / "k1", 1, args.rounds, args.sets)
    print(f"default campaign: k=0 {a:.0f} s, k=1 {b:.0f} s, ratio {b / a:.2f}, floor {cpu_a / cores / a:.2f}")
    print(f"CPU seconds: k=0 {cpu_a:.0f}, k=1 {cpu_b:.0f} ({cpu_b / cpu_a - 1:+.0%})")
    for k, out in ((0, out_a), (1, out_b)):
        gain = next((line for line in out.splitlines() if "held-out gain" in line), "")
        print(f"k={k}: {gain.strip()}")


if __name__ == "__main__":
    interrupts.run_script(main)
