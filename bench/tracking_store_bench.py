"""Benchmark: a command's first MLflow call in a new run folder, with the store MLflow creates (its
schema migrations) against the copy of an empty store (rao_core/tracking_store.py).

Each trial is a fresh interpreter (MLflow caches an opened store in the process), MLflow imported
before the clock starts; the arms alternate, so both see the same machine. Prints each arm's
median wall and CPU seconds and their ratio.

    .venv/bin/python bench/tracking_store_bench.py [--trials 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from rao_core import interrupts

TRIAL = """
import json, sys, time
import mlflow
from rao_core.run import load_config
from rao_core.tracking import Tracker
cfg = load_config(overrides=[f"runs_dir={sys.argv[1]}"])
wall, cpu = time.time(), time.process_time()
Tracker.of(cfg).campaign_run_id()
print(json.dumps({"wall": time.time() - wall, "cpu": time.process_time() - cpu}))
"""


def trial(runs_dir: str, seeded: bool) -> dict:
    env = {**os.environ, "RAO_MLFLOW_TEMPLATE": "1" if seeded else "0"}
    out = subprocess.run(
        [sys.executable, "-c", TRIAL, runs_dir], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    arms: dict[str, list[dict]] = {"created by MLflow": [], "copied": []}
    with tempfile.TemporaryDirectory(prefix="rao-tracking-bench-") as tmp:
        trial(f"{tmp}/warm", seeded=True)  # the template exists from here on, as after a first run
        for i in range(args.trials):
            arms["created by MLflow"].append(trial(f"{tmp}/created-{i}", seeded=False))
            arms["copied"].append(trial(f"{tmp}/copied-{i}", seeded=True))
    medians = {
        arm: {k: statistics.median(t[k] for t in ts) for k in ("wall", "cpu")} for arm, ts in arms.items()
    }
    for arm, m in medians.items():
        print(
            f"{arm:18s} first tracking call: {m['wall']:.2f} s wall, {m['cpu']:.2f} s CPU (median of {args.trials})"
        )
    ratio = medians["created by MLflow"]["cpu"] / medians["copied"]["cpu"]
    print(f"created / copied = {ratio:.1f}x CPU")


if __name__ == "__main__":
    interrupts.run_script(main)
