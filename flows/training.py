"""Prefect flows: the training campaign, one more round, synthesis, evaluation.

Flows take only JSON parameters (a config file path and `section.field=value` overrides) so that
deployments can be triggered from the Prefect UI with the same inputs as the `rao` command.
"""

from __future__ import annotations

from prefect import flow

from rao_core import campaign
from rao_core.config import RunConfig, load_config
from tasks import stages


def _config(config: str | None, overrides: list[str] | None) -> RunConfig:
    return load_config(config, overrides or [])


def run_round(cfg: RunConfig, round_: int) -> dict:
    """One round: rollout (v_r) -> score -> train (v_r+1) -> evaluate (v_r+1) -> report."""
    stages.rollout(cfg, round_)
    stages.score(cfg, round_)
    stages.train(cfg, round_)
    stages.evaluate(cfg, round_ + 1)
    return stages.report(cfg, round_)


@flow(name="rao-train", log_prints=True)
def train_flow(config: str | None = None, overrides: list[str] | None = None) -> dict:
    """The main job: synthesize, warm start, evaluate v0, then `campaign.rounds` rounds."""
    cfg = _config(config, overrides)
    stages.synthesize(cfg)
    stages.warm_start(cfg)
    stages.log_baseline(cfg, stages.evaluate(cfg, 0))
    for r in range(cfg.campaign.rounds):
        run_round(cfg, r)
    return campaign.campaign_summary(cfg)


@flow(name="rao-round", log_prints=True)
def round_flow(config: str | None = None, overrides: list[str] | None = None) -> dict:
    """One more round on the latest checkpoint (what the schedule runs)."""
    cfg = _config(config, overrides)
    stages.synthesize(cfg)
    stages.warm_start(cfg)
    return run_round(cfg, campaign.completed_rounds(cfg))


@flow(name="rao-synthesize")
def synthesize_flow(config: str | None = None, overrides: list[str] | None = None) -> str:
    return stages.synthesize(_config(config, overrides))


@flow(name="rao-evaluate", log_prints=True)
def evaluate_flow(config: str | None = None, overrides: list[str] | None = None, version: int = -1) -> dict:
    """Evaluate a policy version (default: the latest) on held-out tasks."""
    cfg = _config(config, overrides)
    stages.synthesize(cfg)
    stages.warm_start(cfg)
    return stages.evaluate(cfg, campaign.completed_rounds(cfg) if version < 0 else version)
