"""SFT loss of one or more warm starts on one plot (log scale, median of each 25 logged steps).

    .venv/bin/python scripts/plot_warmstart.py --dirs runs/G5/checkpoints/warmstart --out docs/img/warmstart-loss.png

Each folder is a warm start's output (`rao warmstart --out DIR`, a run's checkpoints/warmstart, or
a shipped checkpoint): its train_log.jsonl is read. Prints each one's last logged step and loss.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rao_core.eval.report import plot_sft_loss, sft_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dirs", nargs="+", required=True, help="warm start folders holding train_log.jsonl")
    p.add_argument("--out", default="runs/warmstart-loss.png")
    args = p.parse_args()
    missing = [d for d in args.dirs if not (Path(d) / "train_log.jsonl").is_file()]
    if missing:
        raise SystemExit(f"--dirs: no train_log.jsonl in {', '.join(missing)}")
    logs = {
        Path(d).name if Path(d).name != "warmstart" else Path(d).parent.parent.name: [
            json.loads(line) for line in (Path(d) / "train_log.jsonl").read_text().splitlines() if line
        ]
        for d in args.dirs
    }
    for name, rows in logs.items():
        sft = sft_rows(rows)
        print(
            f"{name}: {len(sft)} logged steps, last step {sft[-1]['step']}, last loss {sft[-1]['loss']:.2e}"
        )
    print(plot_sft_loss(logs, Path(args.out)))


if __name__ == "__main__":
    main()
