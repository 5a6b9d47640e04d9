"""The synthesis stage, first of every flow: the run folder's configuration saved (or a change that
would alter completed stages refused: resume), then the suite's task files (generated once,
offline, seeded), checked before any rollout."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rao_core import resume
from rao_core.envs.checks import check_tasks
from rao_core.envs.suites import open_suite
from rao_core.run import Run
from rao_core.stages.common import note


def prepare(run: Run) -> dict[str, Any]:
    """Before a stage runs: refuse a configuration that would alter completed stages of this run
    folder, then save it (and record any allowed change with the first round it applies to)."""
    cfg = run.config
    run.layout.migrate()  # a run folder of the old naming (rao_core/layout.py)
    diff = resume.check_resume(cfg)
    first = run.layout.completed_rounds()
    resume.record(cfg, diff, first)
    if diff:  # also on the campaign's MLflow run, next to the metrics it explains
        changes = json.dumps({k: list(v) for k, v in diff.items()}, default=str)
        tracker = run.tracker
        tracker.set_tag(tracker.campaign_run_id(), f"config_change.round_{first}", changes)
    return diff


@dataclass(frozen=True)
class Synthesized:
    """Where the suite's files are, which settings changed since the run's last stage, and the
    warnings about its task rows (labels, counts)."""

    data_dir: Path
    changed: dict[str, Any]
    warnings: list[str]


def synthesize(run: Run) -> Synthesized:
    note(run, "synthesis")
    changed = prepare(run)
    suite = open_suite(run.config)
    return Synthesized(
        suite.dir, changed, check_tasks(suite, run.config.rollout, run.config.eval, strict=False)
    )
