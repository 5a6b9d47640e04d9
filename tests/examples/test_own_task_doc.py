"""docs/own-task.md, route A, as written: its files are extracted from the page and its commands run
in a fresh folder (a dataset, a verifier function, no class)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-task.md"


def page_files() -> dict[str, str]:
    """`<!-- file: NAME -->` followed by a fenced block: NAME -> the block's text."""
    return dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", PAGE.read_text(), re.S))


def route_a(tmp_path) -> callable:
    """Route A's files in tmp_path, its questions made; returns a runner of `rao` there."""
    names = ("make_questions.py", "verify.py", "demo.py", "run.yaml")
    files = {k: v for k, v in page_files().items() if k in names}
    assert len(files) == len(names)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    bin_ = Path(sys.executable).parent
    made = subprocess.run(
        [bin_ / "python", "make_questions.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / ".prefect")}  # a campaign's own Prefect
    return lambda *args, timeout=600: subprocess.run(
        [bin_ / "rao", *args], cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_the_dataset_route_runs_as_written(tmp_path):
    """--check tries the verifier on the rows' own answers and one demonstrator tree per difficulty;
    the warm start turns the demonstrator's cells into trees that succeed and says so in one line."""
    rao = route_a(tmp_path)
    check = rao("train", "--check", "--config", "run.yaml")
    assert check.returncode == 0 and "warning" not in check.stderr, check.stderr
    ws = rao("warmstart", "--config", "run.yaml", "--out", "ws", "--set", "warmstart.recursive_episodes=4",
             "--set", "warmstart.flat_episodes=2", "--set", "warmstart.max_steps=2")  # fmt: skip
    assert ws.returncode == 0, ws.stderr[-2000:]
    assert re.match(
        r"warm start: 6 demonstration trees, 6 kept \(\d+ nodes to learn from\), 0 dropped \(roots that ended: "
        r"none\); 2 steps in",
        ws.stdout.strip().splitlines()[-1],
    ), ws.stdout[-1000:]
    rows = [json.loads(line) for line in (tmp_path / "ws" / "sft.jsonl").read_text().splitlines()]
    assert rows and {r["depth"] for r in rows} <= {0, 1}  # roots, and the sub-agents of long questions


@pytest.mark.slow  # a warm start of 6 steps, v0, one RL round, v1 (Prefect, MLflow)
def test_the_dataset_route_trains_on_cpu(tmp_path):
    """`rao train --config run.yaml` on a small budget: the warm start from the demonstrator is v0,
    one RL round trains v1, and both are evaluated on held-out questions."""
    rao = route_a(tmp_path)
    small = ["warmstart.recursive_episodes=8", "warmstart.flat_episodes=4", "warmstart.max_steps=6",
             "campaign.rounds=1", "eval.num_tasks=2", "rollout.num_tasks=2", "rollout.group_size=4",
             "scoring.zero_advantage_groups=keep"]  # fmt: skip
    done = rao("train", "--config", "run.yaml", *(a for o in small for a in ("--set", o)), timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "apples"
    assert (run / "checkpoints" / "warmstart" / "model").is_dir()
    assert all((run / "eval" / f"version={v}" / "_COMPLETE").is_file() for v in (0, 1))
    assert "warm start: 12 demonstration trees" in done.stdout + done.stderr


def test_the_suite_route_runs_as_written(tmp_path):
    """Route B's file: --check is clean, warns about a warm-start setting the suite does not read and
    refuses too many held-out tasks in one line; the scripted expert solves every tree, long tasks
    delegate and every node is verified exactly."""
    files = page_files()
    for name in ("sums.py", "sums.yaml"):
        (tmp_path / name).write_text(files[name])
    rao = Path(sys.executable).parent / "rao"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([rao, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600)

    check = run("train", "--check", "--config", "sums.yaml")
    assert check.returncode == 0 and "warning" not in check.stderr, check.stderr
    warned = run("train", "--check", "--config", "sums.yaml", "--set", "warmstart.flat_tiers=[1]")
    assert warned.returncode == 0, warned.stderr
    assert "warning: warmstart.flat_tiers=[1] does nothing for suite Sums" in warned.stderr
    refused = run("train", "--check", "--config", "sums.yaml", "--set", "eval.num_tasks=50")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("config error: eval.num_tasks: 50: more than the 20")
    rollout = run("rollout", "--config", "sums.yaml", "--set", "policy.kind=scripted")
    assert rollout.returncode == 0, rollout.stderr[-2000:]
    nodes = pq.read_table(tmp_path / "runs" / "sums" / "rollouts" / "round=0").to_pylist()
    roots = [n for n in nodes if n["depth"] == 0]
    assert len(roots) == 8 and all(n["success"] == 1.0 and n["success_source"] == "verifier" for n in nodes)
    assert any(n["children"] == 2 for n in roots if n["difficulty"] == "long")
    assert all(n["children"] == 0 for n in roots if n["difficulty"] == "short")
