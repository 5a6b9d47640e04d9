"""Prefect tasks: one per stage, each calling the stage itself (rao_core/stages/) and saying what
it did in the flow run's log. They return paths (or small dicts of figures), never data frames or
models. A task run is named by its round (`rollout-r3`, `train-r3`) or version (`evaluate-v4`), so
that the UI's timeline shows which rounds overlap (campaign.max_staleness)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from rao_core.run import Run
from rao_core.stages import evaluate as evaluate_stage
from rao_core.stages import report as report_stage
from rao_core.stages import rollout as rollout_stage
from rao_core.stages import score as score_stage
from rao_core.stages import synthesize as synthesize_stage
from rao_core.stages import train as train_stage
from rao_core.stages import warm_start as warm_start_stage
from tasks import artifacts

# Stages are idempotent on their own (complete markers), so Prefect's caching is not needed.
STAGE = {"cache_policy": NO_CACHE, "retries": 1, "retry_delay_seconds": 2}
SHARD = {"cache_policy": NO_CACHE, "retries": 2, "retry_delay_seconds": 2}


def log_lines(text: str) -> None:
    """A stage's summary into the flow run's log: lines that start with WARNING at warning level."""
    logger = get_run_logger()
    for line in text.splitlines():
        (logger.warning if line.startswith("WARNING") else logger.info)(line)


def reused(run: Run, what: str) -> None:
    """A stage whose output an earlier run of this folder completed: said once, not summarised again."""
    get_run_logger().info(f"{run.name} {what}: reused (completed earlier in {run.dir})")


@task(name="synthesize", **STAGE)
def synthesize(run: Run) -> str:
    done = synthesize_stage.synthesize(run)
    if done.changed:
        get_run_logger().info(report_stage.config_change_line(run, done.changed))
    for line in done.warnings:  # labels and counts, before any rollout
        log_lines(line.replace("warning:", "WARNING:", 1))
    return str(done.data_dir)


@task(name="warm-start", log_prints=False, **STAGE)  # dill (datasets) prints `dis` output
def warm_start(run: Run) -> str:
    if run.config.policy.model == "warmstart" and run.layout.warmstart_complete():
        reused(run, "warm start")
    return str(warm_start_stage.warm_start(run))


@task(name="rollout", task_run_name="rollout-r{round_}", **STAGE)
def rollout(run: Run, round_: int) -> str:
    done = run.layout.complete(run.layout.rollouts(round_))
    path = rollout_stage.roll_out(run, round_)
    if done:
        reused(run, f"round {round_} rollout")
    else:
        get_run_logger().info(report_stage.rollout_line(run, round_))
    return str(path)


@task(name="rollout-shard", task_run_name="rollout-r{round_}-shard-{shard}", **SHARD)
def rollout_shard(run: Run, round_: int, shard: int) -> str:
    """One shard of a round (one Ray task under the Ray task runner). Prefect retries it when it
    raises; Ray re-runs it when its worker is lost. Either way a complete shard is not redone."""
    return str(rollout_stage.roll_out_shard(run, round_, shard))


@task(name="evaluate-shard", task_run_name="evaluate-v{version}-shard-{shard}", **SHARD)
def evaluate_shard(run: Run, version: int, shard: int) -> str:
    """One shard of a version's evaluation, retried like a rollout shard."""
    return str(evaluate_stage.evaluate_shard(run, version, shard))


@task(name="score", task_run_name="score-r{round_}", **STAGE)
def score(run: Run, round_: int) -> str:
    done = run.layout.complete(run.layout.scores(round_))
    path = score_stage.score(run, round_)
    if done:
        reused(run, f"round {round_} score")
    else:
        log_lines(report_stage.score_line(run, round_))
    return str(path)


@task(
    name="train", task_run_name="train-r{round_}", log_prints=False, **STAGE
)  # dill (datasets) prints `dis` output
def train(run: Run, round_: int) -> str:
    done = run.layout.checkpoint_complete(round_ + 1)
    train_stage.train(run, round_)
    if done:
        reused(run, f"round {round_} train")
    else:
        log_lines(report_stage.train_line(run, round_))
    return str(run.layout.checkpoint(round_ + 1))


@task(name="evaluate", task_run_name="evaluate-v{version}", **STAGE)
def evaluate(run: Run, version: int) -> dict:
    done = run.layout.complete(run.layout.eval(version))
    summary = evaluate_stage.evaluate(run, version)
    if done:
        reused(run, f"v{version} evaluation")
    else:
        get_run_logger().info(report_stage.eval_line(run, version, summary))
    return summary


@task(name="report", task_run_name="report-r{round_}", cache_policy=NO_CACHE)
def report(run: Run, round_: int) -> dict:
    """Log the round to MLflow (once) and summarise it as Prefect artifacts in the UI."""
    metrics = report_stage.round_report(run, round_)
    run.tracker.log_round(round_, metrics)
    key = artifacts.artifact_key(run, "round", round_)
    create_table_artifact(key=key, table=artifacts.summary_rows(metrics), description=f"round {round_}")
    create_markdown_artifact(
        key=f"{key}-summary", markdown=report_stage.summary_markdown(run, round_, metrics)
    )
    return metrics


@task(name="campaign-report", cache_policy=NO_CACHE)
def campaign_report(run: Run) -> list[str]:
    """Learning curves (both arms) and depth against difficulty: files, MLflow, a Prefect artifact."""
    files = report_stage.write_campaign_report(run)
    if "curves" in files:
        create_markdown_artifact(
            key=artifacts.artifact_key(run, "learning-curves"),
            markdown="# Learning curves\n\n" + files["curves"].read_text(),
        )
    log_lines("\n".join(report_stage.gain_lines(run) + report_stage.signal_lines(run)))
    return [str(p) for p in files.values()]


@task(name="compare", **STAGE)
def compare(run: Run, version: int) -> dict:
    """Single against recursive across context limits for one policy version (the paper's table)."""
    result = evaluate_stage.compare(run, version)
    files = report_stage.write_comparison(run, result)
    create_markdown_artifact(
        key=artifacts.artifact_key(run, "compare", version), markdown=files["table"].read_text()
    )
    return result


@task(name="log-baseline", cache_policy=NO_CACHE)
def log_baseline(run: Run, eval_metrics: dict) -> None:
    run.tracker.log_baseline(eval_metrics)
