"""Sum the lines bench/process_cpu/sitecustomize.py wrote, by kind of process: how many, their
CPU-seconds, and the mean (the table of docs/testing.md, "where the CPU goes").

    .venv/bin/python bench/process_cpu_report.py /tmp/procs.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict

KINDS = [  # (the kind, a pattern of the command line), the first match wins
    ("the transformers engine's children (policy.engine_processes)", r"engines/hf_process"),
    (
        "`rao train` / `round` / `eval` / `rollout`",
        r"^(-c|\S*flows/cli\.py|\S*bin/rao) (train|round|eval|rollout)\b",
    ),
    ("vLLM servers", r"vllm\.entrypoints|vllm/entrypoints"),
    ("Prefect flow runs started by a worker", r"prefect/engine\.py"),
    ("torchrun ranks (rao_core/train/stage.py)", r"rao_core/train/stage\.py"),
    ("pytest (its workers and the runs of the GPU check)", r"^-u -c import sys;exec|pytest/__main__"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    args = ap.parse_args()
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    with open(args.log) as f:
        for line in f:
            rec = json.loads(line)
            kind = next((k for k, pattern in KINDS if re.search(pattern, rec["argv"])), "others")
            sums[kind][0] += 1
            sums[kind][1] += rec["cpu"]
    print("| processes | how many | CPU-s | each |\n|---|---|---|---|")
    for kind, (n, cpu) in sorted(sums.items(), key=lambda kv: -kv[1][1]):
        print(f"| {kind} | {n} | {cpu:.0f} | {cpu / n:.1f} |")


if __name__ == "__main__":
    main()
