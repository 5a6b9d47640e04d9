"""docs/own-task.md, route A, as written: its files are extracted from the page and its commands run
in a fresh folder (a dataset, a verifier function, no class)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-task.md"


def page_files() -> dict[str, str]:
    """`<!-- file: NAME -->` followed by a fenced block: NAME -> the block's text."""
    return dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", PAGE.read_text(), re.S))


def test_the_dataset_route_runs_as_written(tmp_path):
    files = {k: v for k, v in page_files().items() if k in ("make_questions.py", "verify.py", "run.yaml")}
    assert len(files) == 3
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    bin_ = Path(sys.executable).parent
    run = lambda *cmd: subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)  # noqa: E731
    made = run(bin_ / "python", "make_questions.py")
    assert made.returncode == 0, made.stderr
    check = run(bin_ / "rao", "train", "--check", "--config", "run.yaml")
    assert check.returncode == 0, check.stderr
    rollout = run(bin_ / "rao", "rollout", "--config", "run.yaml", "--set", "rollout.num_tasks=2",
                  "--set", "rollout.group_size=2")  # fmt: skip
    assert rollout.returncode == 0, rollout.stderr[-2000:]
    nodes = pq.read_table(tmp_path / "runs" / "apples" / "rollouts" / "round=0").to_pylist()
    roots = [n for n in nodes if n["depth"] == 0]
    assert len(roots) == 4 and {n["difficulty"] for n in roots} <= {"short", "long"}
    assert all(n["success_source"] == "verifier" and 0.0 <= n["success"] <= 1.0 for n in roots)
    assert all("apple" in n["goal"] for n in roots) and all("context" in n["transcript"] for n in roots)


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
