"""Prefect tasks: one per stage, each a few lines around a rao_core function, returning paths
(or small dicts of figures), never data frames or models."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from rao_core import campaign
from rao_core.config import RunConfig

# Stages are idempotent on their own (complete markers), so Prefect's caching is not needed.
STAGE = {"cache_policy": NO_CACHE, "retries": 1, "retry_delay_seconds": 2}


@task(name="synthesize", **STAGE)
def synthesize(cfg: RunConfig) -> str:
    from rao_core.envs.suites import open_suite

    campaign.prepare(cfg)
    return str(open_suite(cfg).dir)


@task(name="warm-start", **STAGE)
def warm_start(cfg: RunConfig) -> str:
    return str(campaign.stage_warm_start(cfg))


@task(name="rollout", **STAGE)
def rollout(cfg: RunConfig, round_: int) -> str:
    return str(campaign.stage_rollout(cfg, round_))


@task(name="score", **STAGE)
def score(cfg: RunConfig, round_: int) -> str:
    return str(campaign.stage_score(cfg, round_))


@task(name="train", **STAGE)
def train(cfg: RunConfig, round_: int) -> str:
    campaign.stage_train(cfg, round_)
    return str(campaign.checkpoint_dir(cfg, round_ + 1))


@task(name="evaluate", **STAGE)
def evaluate(cfg: RunConfig, version: int) -> dict:
    return campaign.stage_evaluate(cfg, version)


@task(name="report", cache_policy=NO_CACHE)
def report(cfg: RunConfig, round_: int) -> dict:
    """Log the round to MLflow (once) and summarise it as Prefect artifacts in the UI."""
    metrics = campaign.round_report(cfg, round_)
    campaign.log_round(cfg, round_, metrics)
    key = campaign.artifact_key(cfg, "round", round_)
    create_table_artifact(key=key, table=campaign.summary_rows(metrics), description=f"round {round_}")
    create_markdown_artifact(key=f"{key}-summary", markdown=campaign.summary_markdown(cfg, round_, metrics))
    return metrics


@task(name="log-baseline", cache_policy=NO_CACHE)
def log_baseline(cfg: RunConfig, eval_metrics: dict) -> None:
    campaign.log_baseline(cfg, eval_metrics)
