"""The scoring stage: round N's node rewards, depth weights, group baselines, advantages and
staleness, in DuckDB over the round's Parquet (sql/, rao_core/scoring.py): scores/round=N/scores.parquet."""

from __future__ import annotations

from pathlib import Path

from rao_core.run import Run
from rao_core.scoring import score_round
from rao_core.stages.common import note


def score(run: Run, round_: int) -> Path:
    """Score round `round_` with scoring.*, dropping trees sampled more than
    campaign.max_staleness versions before version `round_` (a complete scores partition is
    returned as it is)."""
    note(run, f"scoring of round {round_}")
    return score_round(run.dir, round_, run.config.scoring, run.config.campaign.max_staleness)
