"""Prefect tasks: one per stage, each a few lines around a rao_core function, returning paths
(or small dicts of figures), never data frames or models."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from rao_core import campaign, reporting, tracking
from rao_core.config import RunConfig
from tasks import artifacts

# Stages are idempotent on their own (complete markers), so Prefect's caching is not needed.
STAGE = {"cache_policy": NO_CACHE, "retries": 1, "retry_delay_seconds": 2}


def log_lines(text: str) -> None:
    """A stage's summary into the flow run's log: lines that start with WARNING at warning level."""
    logger = get_run_logger()
    for line in text.splitlines():
        (logger.warning if line.startswith("WARNING") else logger.info)(line)


def reused(cfg: RunConfig, what: str) -> None:
    """A stage whose output an earlier run of this folder completed: said once, not summarised again."""
    get_run_logger().info(f"{cfg.run_name} {what}: reused (completed earlier in {cfg.run_dir})")


@task(name="synthesize", **STAGE)
def synthesize(cfg: RunConfig) -> str:
    from rao_core.envs.checks import check_tasks
    from rao_core.envs.suites import open_suite

    diff = campaign.prepare(cfg)
    if diff:
        get_run_logger().info(reporting.config_change_line(cfg, diff))
    suite = open_suite(cfg)
    for line in check_tasks(suite, cfg, strict=False):  # labels and counts, before any rollout
        log_lines(line.replace("warning:", "WARNING:", 1))
    return str(suite.dir)


@task(name="warm-start", log_prints=False, **STAGE)  # dill (datasets) prints `dis` output
def warm_start(cfg: RunConfig) -> str:
    if cfg.policy.model == "warmstart" and cfg.layout.warmstart_complete():
        reused(cfg, "warm start")
    return str(campaign.stage_warm_start(cfg))


@task(name="rollout", **STAGE)
def rollout(cfg: RunConfig, round_: int) -> str:
    done = cfg.layout.complete(cfg.layout.rollouts(round_))
    path = campaign.stage_rollout(cfg, round_)
    if done:
        reused(cfg, f"round {round_} rollout")
    else:
        get_run_logger().info(reporting.rollout_line(cfg, round_))
    return str(path)


@task(name="rollout-shard", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def rollout_shard(cfg: RunConfig, round_: int, shard: int) -> str:
    """One shard of a round (one Ray task under the Ray task runner). Prefect retries it when it
    raises; Ray re-runs it when its worker is lost. Either way a complete shard is not redone."""
    from rao_core.rollout import rollout_shard

    path = rollout_shard(
        campaign.round_config(cfg, round_), shard, model_path=campaign.model_path(cfg, round_)
    )
    return str(path)


@task(name="evaluate-shard", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def evaluate_shard(cfg: RunConfig, version: int, shard: int) -> str:
    """One shard of a version's evaluation, retried like a rollout shard."""
    from rao_core.eval.evaluate import evaluate_shard

    path = evaluate_shard(
        campaign.round_config(cfg, version), version, shard, campaign.model_path(cfg, version)
    )
    return str(path)


@task(name="score", **STAGE)
def score(cfg: RunConfig, round_: int) -> str:
    done = cfg.layout.complete(cfg.layout.scores(round_))
    path = campaign.stage_score(cfg, round_)
    if done:
        reused(cfg, f"round {round_} score")
    else:
        log_lines(reporting.score_line(cfg, round_))
    return str(path)


@task(name="train", log_prints=False, **STAGE)  # dill (datasets) prints `dis` output
def train(cfg: RunConfig, round_: int) -> str:
    done = cfg.layout.checkpoint_complete(round_ + 1)
    campaign.stage_train(cfg, round_)
    if done:
        reused(cfg, f"round {round_} train")
    else:
        log_lines(reporting.train_line(cfg, round_))
    return str(cfg.layout.checkpoint(round_ + 1))


@task(name="evaluate", **STAGE)
def evaluate(cfg: RunConfig, version: int) -> dict:
    done = cfg.layout.complete(cfg.layout.eval(version))
    summary = campaign.stage_evaluate(cfg, version)
    if done:
        reused(cfg, f"v{version} evaluation")
    else:
        get_run_logger().info(reporting.eval_line(cfg, version, summary))
    return summary


@task(name="report", cache_policy=NO_CACHE)
def report(cfg: RunConfig, round_: int) -> dict:
    """Log the round to MLflow (once) and summarise it as Prefect artifacts in the UI."""
    metrics = reporting.round_report(cfg, round_)
    tracking.log_round(cfg, round_, metrics)
    key = artifacts.artifact_key(cfg, "round", round_)
    create_table_artifact(key=key, table=artifacts.summary_rows(metrics), description=f"round {round_}")
    create_markdown_artifact(key=f"{key}-summary", markdown=reporting.summary_markdown(cfg, round_, metrics))
    return metrics


@task(name="campaign-report", cache_policy=NO_CACHE)
def campaign_report(cfg: RunConfig) -> list[str]:
    """Learning curves (both arms) and depth against difficulty: files, MLflow, a Prefect artifact."""
    files = reporting.write_campaign_report(cfg)
    if "curves" in files:
        create_markdown_artifact(
            key=artifacts.artifact_key(cfg, "learning-curves"),
            markdown="# Learning curves\n\n" + files["curves"].read_text(),
        )
    log_lines("\n".join(reporting.gain_lines(cfg) + reporting.signal_lines(cfg)))
    return [str(p) for p in files.values()]


@task(name="compare", **STAGE)
def compare(cfg: RunConfig, version: int) -> dict:
    """Single against recursive across context limits for one policy version (the paper's table)."""
    from rao_core.eval.compare import compare_version

    result = compare_version(cfg, version, campaign.model_path(cfg, version))
    files = reporting.write_comparison(cfg, result)
    create_markdown_artifact(
        key=artifacts.artifact_key(cfg, "compare", version), markdown=files["table"].read_text()
    )
    return result


@task(name="log-baseline", cache_policy=NO_CACHE)
def log_baseline(cfg: RunConfig, eval_metrics: dict) -> None:
    tracking.log_baseline(cfg, eval_metrics)
