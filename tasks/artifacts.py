"""What a run shows in the Prefect UI: artifact keys and the tables and markdown behind them."""

from __future__ import annotations

import re
from typing import Any

from rao_core import tracking
from rao_core.run import Run


def artifact_key(run: Run, *parts: object) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    text = "-".join(str(p) for p in (run.name, *parts)).lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")


def summary_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """A flat (metric, value) table of a round, for the Prefect UI."""
    return [{"metric": k, "value": round(v, 4)} for k, v in tracking.flatten(metrics).items()]
