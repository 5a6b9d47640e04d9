"""examples/filecount: a suite written outside rao_core. Its expert solves every tree, it imports no
private name of rao_core, and a short version of its main job runs (the full one: its README)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from rao_core.envs.suites import open_suite
from rao_core.run import Run, load_config
from rao_core.stages.rollout import roll_out

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CONFIG = ROOT / "examples" / "filecount" / "config.yaml"


def test_examples_import_no_private_name_of_rao_core():
    files = sorted(EXAMPLES.rglob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rao_core"):
                names = [*node.module.split("."), *(a.name for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [
                    part for a in node.names if a.name.startswith("rao_core") for part in a.name.split(".")
                ]
            else:
                continue
            assert not [n for n in names if n.startswith("_")], f"{path}: {ast.unparse(node)}"


def test_the_expert_solves_every_tree_at_every_depth(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(CONFIG, [f"runs_dir={tmp_path}", "policy.kind=scripted", "rollout.difficulty=easy,medium,hard",
                               "suite_args.tasks_per_difficulty=8"])  # fmt: skip
    nodes = __import__("pyarrow.parquet").parquet.read_table(roll_out(Run(cfg), 0)).to_pylist()
    assert nodes and all(n["success"] == 1.0 for n in nodes)
    assert max(n["depth"] for n in nodes) == 3
    suite = open_suite(cfg)
    env = suite.env(suite.tasks("val")[0])
    assert env.ls(7) == "no folder at [7]" and env.ls().startswith(f"{env.kind} ")


@pytest.mark.slow
def test_a_short_main_job(tmp_path):
    """One round of `rao train --config examples/filecount/config.yaml` on a small budget."""
    short = [
        f"runs_dir={tmp_path}", "campaign.rounds=1", "warmstart.recursive_episodes=16", "warmstart.flat_episodes=8",
        "warmstart.max_minutes=0.5", "warmstart.max_steps=5", "rollout.num_tasks=2", "rollout.group_size=2",
        "eval.num_tasks=2", "suite_args.tasks_per_difficulty=4",
        "scoring.zero_advantage_groups=keep",  # a 5-step warm start solves nothing: train anyway, no early stop
    ]  # fmt: skip
    args = [arg for s in short for arg in ("--set", s)]
    done = subprocess.run([Path(sys.executable).parent / "rao", "train", "--config", str(CONFIG), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "filecount"
    assert (run / "checkpoints" / "version=1").is_dir()
    assert (run / "eval" / "version=1").is_dir()
