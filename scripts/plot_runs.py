"""Held-out success of several runs on one plot (reruns with other seeds, or other settings).

    .venv/bin/python scripts/plot_runs.py --run-dirs runs/seed0 runs/seed1 runs/seed2 --out docs/img/seeds.png

Reads each run's complete evaluations (runs/<name>/eval/version=v/); prints the table it plots.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rao_core.eval.report import plot_runs
from rao_core.stages.report import eval_history_of


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dirs", nargs="+", required=True, help="run folders, e.g. runs/default runs/arms")
    p.add_argument("--difficulty", default="all", help="all, or one evaluated difficulty")
    p.add_argument("--out", default="runs/runs.png")
    args = p.parse_args()
    runs = {Path(run).name: eval_history_of(Path(run)) for run in args.run_dirs}
    empty = [name for name, history in runs.items() if not history]
    if empty:
        raise SystemExit(f"--run-dirs: no complete evaluation in {', '.join(empty)}")
    for name, history in runs.items():
        cells = " ".join(
            f"{100 * h.get(args.difficulty, {}).get('success', float('nan')):.0f}" for h in history.values()
        )
        print(f"{name}: {cells}")
    print(plot_runs(runs, Path(args.out), args.difficulty))


if __name__ == "__main__":
    main()
