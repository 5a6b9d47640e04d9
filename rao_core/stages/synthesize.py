"""The synthesis stage: the suite's task files (generated once, offline, seeded), checked before
any rollout; and the run folder's configuration saved (or a change refused) for resume."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rao_core.envs.checks import check_tasks
from rao_core.envs.suites import open_suite
from rao_core.run import Run
from rao_core.stages.common import prepare


@dataclass(frozen=True)
class Synthesized:
    """Where the suite's files are, which settings changed since the run's last stage, and the
    warnings about its task rows (labels, counts)."""

    data_dir: Path
    changed: dict[str, Any]
    warnings: list[str]


def synthesize(run: Run) -> Synthesized:
    changed = prepare(run)
    suite = open_suite(run.config)
    return Synthesized(suite.dir, changed, check_tasks(suite, run.config, strict=False))
