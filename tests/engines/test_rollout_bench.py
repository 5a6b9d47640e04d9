"""bench/rollout_bench.py keeps working: a one-task round on engine processes and in process (the
same trees), then the replay of its forwards through the bare model, on the same token schedule."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_bench_replays_the_rounds_forwards(tmp_path):
    out = subprocess.run(
        [sys.executable, "bench/rollout_bench.py", "--set", "rollout.num_tasks=1", "--set", "rollout.group_size=2",
         "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    forwards = int(re.search(r"(\d+) forwards in process \((\d+) decode steps", out).group(1))
    assert forwards > 2
    rollout = float(re.search(r"\(a\) rollout: +([\d.]+) s", out).group(1))
    forward = float(re.search(r"\(b\) forward-only: +([\d.]+) s", out).group(1))
    ratio = float(re.search(r"rollout / forward-only = ([\d.]+)x", out).group(1))
    # Each figure is printed to 0.1, so the ratio of the printed seconds may be off by their rounding
    # (0.6 s printed may be 0.55 s): check the printed ratio against the interval rounding allows.
    assert forward > 0.05
    lowest, highest = (rollout - 0.05) / (forward + 0.05), (rollout + 0.05) / (forward - 0.05)
    assert lowest - 0.05 <= ratio <= highest + 0.05
    assert "trees token for token as (a): True" in out  # engine processes = one engine in process
    assert (tmp_path / "bench" / "rollouts" / "round=0" / "nodes.parquet").is_file()
