"""The memory plan (rao_core/memory.py) against the train stage's measured peak RSS on SmolLM2 in
bf16 autocast over float32 master weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rao_core import memory
from rao_core.campaign import engines
from rao_core.run import Run, load_config
from rao_core.stages.rollout import roll_out
from rao_core.stages.score import score
from tests.real import needs_bf16_units

pytestmark = [pytest.mark.real, pytest.mark.slow, needs_bf16_units]


def test_the_memory_plan_against_the_train_stage_peak(agent, tmp_path):
    """The train stage in a process of its own (python -m rao_core.train.stage) on a round of
    SmolLM2 rows: its peak RSS against rao_core/memory.py's estimate for the same settings.

    Within 10% on the recipe's rounds (docs/real-model.md, "Memory"), but not on this round: its
    peak moved from 3.9 to 8.8 GiB between runs of this test (the warm-started agent differs, and
    so do its rows) against a plan of 7.1, for reasons not found yet. Asserted: the plan is within
    a factor of 2 of the peak either way; both peaks are printed."""
    cfg = load_config(
        overrides=[
            f"runs_dir={tmp_path}", "run_name=mem", "suite=textcraft-small", f"policy.model={agent}",
            "rollout.num_tasks=2", "rollout.group_size=4", "rollout.difficulty=easy", "agent.max_steps=4",
            "agent.max_new_tokens=24", "scoring.zero_advantage_groups=keep", "train.max_tokens_per_microbatch=2048",
            "tracking.enabled=false",
        ]
    )  # fmt: skip
    run = Run(cfg)
    with engines(run):
        roll_out(run, 0)
    score(run, 0)

    plan = memory.plan(cfg.train, cfg.policy, agent, memory.devices()).total("train")
    stage = [
        sys.executable, "-m", "rao_core.train.stage", "--run-dir", str(run.dir), "--round", "0",
        "--model", str(agent), "--set", "train.max_tokens_per_microbatch=2048",
    ]  # fmt: skip

    def peak_gib(out: str, **env: str) -> float:
        done = subprocess.run(
            [*stage, "--out", str(tmp_path / out)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **env},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mib"] / 1024

    live = peak_gib("system-malloc", RAO_KEEP_SYSTEM_MALLOC="1")
    kept = peak_gib("kept")  # the stage as it runs: freed memory kept for reuse (rao_core/allocator.py)
    print(
        f"train stage peak RSS {live:.2f} GiB (glibc's defaults), {kept:.2f} GiB (freed memory kept); plan {plan:.2f} GiB ({plan / live - 1:+.0%}, {plan / kept - 1:+.0%})"
    )
    assert 0.5 <= plan / live <= 2 and 0.5 <= plan / kept <= 2
