"""scripts/gpu_check.sh: its dry run on this CPU (what CI runs), and its one-line refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def check(*args: str, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable, **env}
    return subprocess.run(
        ["bash", SCRIPT, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def test_a_bad_argument_or_a_python_without_the_project_is_refused_in_one_line(tmp_path):
    out = check("--gpu", OUT=str(tmp_path / "out"))
    assert out.returncode == 2 and out.stdout.strip() == "usage: bash scripts/gpu_check.sh [--dry-run]"
    out = check("--dry-run", PY="/usr/bin/false", OUT=str(tmp_path / "out"))
    assert out.returncode == 2 and "cannot import rao_core" in out.stdout
    assert not (tmp_path / "out").exists()
    (tmp_path / "mine").mkdir()
    out = check("--dry-run", OUT=str(tmp_path / "mine"))  # a folder the check did not write is kept
    assert (
        out.returncode == 2
        and "is not an earlier check's folder" in out.stdout
        and (tmp_path / "mine").is_dir()
    )


@pytest.mark.slow
def test_the_dry_run_runs_every_part_on_the_cpu_within_its_budget(tmp_path):
    out_dir = tmp_path / "gpu-check"
    out = check("--dry-run", OUT=str(out_dir))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((out_dir / "results.json").read_text())
    parts = result["parts"]
    assert result["mode"] == "dry-run"  # each part ran under its own timeout, inside the budget
    assert list(parts) == [
        "env", "pytest-gpu", "decode-bench", "real-size", "rao-train", "rollout-bench", "install-offline", "overlap"
    ]  # fmt: skip
    for name, part in parts.items():
        assert part["verdict"] == "ok", (name, part, (out_dir / "logs" / f"{name}.log").read_text()[-2000:])  # fmt: skip
    assert parts["env"]["figures"]["cuda_available"] is False
    assert "textcraft" in parts["env"]["figures"]["rao_suites"]
    assert parts["pytest-gpu"]["figures"].get("failed", 0) == 0  # no CUDA here: the gpu tier is skipped
    assert (
        parts["pytest-gpu"]["figures"]["skipped"] > 0
        and len(parts["pytest-gpu"]["figures"]["closing_lines"]) == 2
    )
    train = parts["rao-train"]["figures"]["versions"]["version=1"]
    assert train["tokens"] > 0 and train["served_dtype"] == "bfloat16" and train["lr"] == 3e-6
    real = parts["real-size"]["figures"]["real_size_tiny"]
    assert real["rollout"]["trees"] == 2 and real["rollout"]["sampled_tokens_per_s"] > 0
    assert (
        "policy.max_batch_size=128" in real["overrides"] and "agent.max_new_tokens=256" in real["overrides"]
    )
    engine = real["rollout"]["engine"]  # decode and prefill apart, graphs counted (none on a CPU)
    assert engine["decode_seconds"] > 0 and engine["prefill_seconds"] > 0 and engine["tokens_generated"] > 0
    assert (engine["graph_captures"], engine["graph_fallbacks"], engine["graphs_on"]) == (0, 0, False)
    assert real["train"]["tokens"] > 0 and real["plan_vs_measured_gib"]["train"]["plan"] > 0
    assert any(line.startswith("(a) rollout:") for line in parts["rollout-bench"]["figures"]["lines"])
    bench = parts["decode-bench"]["figures"]["lines"]
    assert any("host time per decode step at 128 rows" in line for line in bench)
    assert any("1.0 per arriving row" in line for line in bench)
    assert any(
        line.startswith("imported with the network off:")
        for line in parts["install-offline"]["figures"]["lines"]
    )
    assert parts["overlap"]["figures"]["lines"] == [  # no GPU: said in one line
        "overlap: skipped: 0 GPU(s); rounds that overlap put the engines and the trainer on two"
    ]
