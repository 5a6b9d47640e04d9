"""Held-out success of two policy versions of a run at the sampling temperature, paired by task.

    .venv/bin/python scripts/sampled_eval.py --run-dir runs/l4 --versions 0 5 --temperature 1 --samples 4
    .venv/bin/python scripts/sampled_eval.py --run-dir runs/default --versions 0 8 --temperature 0 --samples 1 \
        --difficulty extreme      # greedy, on a tier the campaign does not evaluate every round

Greedy evaluation (the campaign's) scores one deterministic tree per task; RL optimises the policy
as it samples. This rolls out `--samples` trees per held-out task (the campaign's fixed eval tasks)
for each version, into <run>/eval-sampled/T=<t>,k=<k>/v=<n>/ (resumable partitions), and prints
success per difficulty plus the paired difference last - first with a 95% bootstrap interval over
tasks. Version 0 is the run's starting model (policy.model); version n is checkpoints/version=n.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rao_core.config import ConfigError
from rao_core.eval.metrics import paired_bootstrap, per_task_success, tree_metrics
from rao_core.layout import RunLayout
from rao_core.run import Run, load_config
from rao_core.stages.common import sample
from rao_core.stages.evaluate import evaluation_draw
from rao_core.store.parquet import read_partition


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--run-dir", required=True, help="run folder of a finished or running campaign, e.g. runs/default"
    )
    p.add_argument("--versions", type=int, nargs="+", default=[0], help="policy versions (0 = start)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--samples", type=int, default=4, help="trees per held-out task")
    p.add_argument("--difficulty", default="", help="comma list (default: the run's eval.difficulty)")
    args = p.parse_args()
    run = Path(args.run_dir)
    overrides = [f"runs_dir={run.parent}", f"run_name={run.name}"]
    overrides += [f"eval.difficulty={args.difficulty}"] if args.difficulty else []
    try:  # --difficulty is checked like the setting it overrides
        cfg = load_config(RunLayout(run).config, overrides)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    cell = f"T={args.temperature},k={args.samples}" + (f",d={args.difficulty}" if args.difficulty else "")
    results = {}
    for v in args.versions:
        model = None if v == 0 else cfg.layout.checkpoint(v)
        if model is not None and not model.is_dir():
            raise SystemExit(f"--versions: {model} does not exist")
        dest = cfg.layout.sampled_eval(cell, v)
        draw = evaluation_draw(Run(cfg), v, args.samples, args.temperature)
        sample(Run(cfg), dest, draw, v, progress=True)
        rows = read_partition(dest, "nodes").to_pylist()
        m = tree_metrics(rows)
        results[v] = per_task_success(rows)
        cells = ", ".join(
            f"{d} {m[d]['success']:.1%}" for d in m if isinstance(m[d], dict) and "trees" in m[d]
        )
        print(f"v{v}: {cells} ({m['all']['trees']} trees)", flush=True)
    if len(results) >= 2:
        first, last = args.versions[0], args.versions[-1]
        tasks = sorted(results[first])
        diffs = [results[last][t] - results[first][t] for t in tasks]
        lo, hi = paired_bootstrap(diffs)
        better, worse = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
        print(
            f"v{last} - v{first}: {sum(diffs) / len(diffs):+.1%} [95% bootstrap {lo:+.1%}, {hi:+.1%}] "
            f"over {len(tasks)} tasks ({better} better, {worse} worse)"
        )


if __name__ == "__main__":
    main()
