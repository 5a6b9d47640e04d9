"""The warm-start stage: policy version 0 exists after it. Shipped, given, or trained here once
with warmstart.* (SFT on the suite's expert trees or on demonstrations, rao_core/train/warmstart.py)
into <run>/checkpoints/warmstart/model."""

from __future__ import annotations

from pathlib import Path

from rao_core.envs.suites import open_suite
from rao_core.run import Run
from rao_core.stages.common import note


def warm_start(run: Run) -> Path:
    """Version 0's checkpoint, trained first when policy.model is 'warmstart' and not yet done."""
    note(run, "warm start")
    if run.config.policy.model == "warmstart" and not run.layout.warmstart_complete():
        from rao_core.train.warmstart import warm_start as train_warm_start  # torch, TRL

        train_warm_start(run.config.warmstart, run.layout.warmstart, open_suite(run.config))
    return run.checkpoints.initial()
