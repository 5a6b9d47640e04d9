"""Prefect flows: the training campaign, one more round, a rollout (sharded on Ray with
`rollout.runner=ray`, docs/scale-out.md), synthesis, evaluation.

Flows take only JSON parameters (a config file path and `section.field=value` overrides) so that
deployments can be triggered from the Prefect UI with the same inputs as the `rao` command.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
from pathlib import Path

from prefect import flow, task, unmapped
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import TaskRunner

from rao_core import campaign, interrupts, placement, runlock, tracking
from rao_core.run import Run
from rao_core.stages import report
from rao_core.stages.common import note
from rao_core.store.parquet import is_complete
from tasks import stages


def _run(config: str | None, overrides: list[str] | None) -> Run:
    return Run.load(config, overrides or [])


@contextlib.contextmanager
def writing(runs: list[Run], command: str):
    """One writer per run folder (rao_core/runlock.py): every arm's folder, for the flow's life. A
    flow whose folder another run writes (a scheduled round, a run started from the UI) waits for
    it, with a line in its log, rather than failing: the folder is the queue. Started by `rao`, the
    flow leaves SIGTERM to `rao`'s handler (Prefect installs its own in a flow); a served flow run
    keeps Prefect's, through which the UI's Cancel arrives."""
    from prefect import get_run_logger

    interrupts.reinstall()  # under `rao`, SIGTERM stays `rao`'s in the flow too (Prefect takes it)
    with contextlib.ExitStack() as stack:
        for run in runs:
            stack.enter_context(runlock.writing(run.dir, command, wait=get_run_logger().info))
        yield


# Ray re-runs a shard whose worker process (or node) was lost this many times.
SHARD_RAY_RETRIES = 2


@contextlib.contextmanager
def ray_session(run: Run):
    """With `rollout.runner=ray`, one Ray connection for the whole flow run: every round's shards
    reuse it and its warm workers (a local instance takes 7-11 s to start here, about as long as a
    sharded round). The task runner below finds Ray initialised and leaves it running."""
    if run.config.rollout.runner != "ray":
        yield
        return
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init(address=run.config.rollout.ray_address or "local")  # None would join a `ray start` cluster
    interrupts.reinstall()  # Ray's driver takes SIGTERM for itself: `rao` ends it as any interrupt
    try:
        yield
    finally:
        ray.shutdown()


def ray_runner(run: Run) -> TaskRunner:
    """Prefect's Ray task runner on `rollout.ray_address` ('' starts a local Ray instance for the
    flow run; an already initialised Ray in this process is used as is)."""
    from prefect_ray import RayTaskRunner

    return RayTaskRunner(init_kwargs={"address": run.config.rollout.ray_address or "local"})


@flow(name="rao-shards", log_prints=True, validate_parameters=False)
def shards_flow(run: Run, stage: str, index: int) -> list[str]:
    """Every shard of round `index`'s rollout (`stage` "rollout") or of version `index`'s evaluation
    ("evaluate") as one task run, mapped over the flow's task runner (Ray), each reserving
    `rollout.num_cpus_per_shard` CPUs and `num_gpus_per_shard` GPUs. The run folder goes out as an
    absolute path: workers on other nodes have other working directories."""
    from prefect_ray.context import remote_options

    shard_task = {"rollout": stages.rollout_shard, "evaluate": stages.evaluate_shard}[stage]
    run = Run(dataclasses.replace(run.config, runs_dir=str(Path(run.config.runs_dir).resolve())))
    r = run.config.rollout
    with remote_options(
        num_cpus=r.num_cpus_per_shard, num_gpus=r.num_gpus_per_shard, max_retries=SHARD_RAY_RETRIES
    ):
        futures = shard_task.map(unmapped(run), index, range(r.shards))
    return futures.result()


def shards_on_ray(run: Run, stage: str, index: int) -> None:
    note(run, f"rollout of round {index}" if stage == "rollout" else f"evaluation of version {index}")
    r = run.config.rollout
    placement.wait_for_room(r.num_cpus_per_shard, r.num_gpus_per_shard, r.placement_timeout_s)
    shards_flow.with_options(name=f"rao-{stage}-shards", task_runner=ray_runner(run))(run, stage, index)


def rollout(run: Run, round_: int) -> str:
    """The round's rollout. With `rollout.runner=ray` the shards run first, in parallel on the Ray
    cluster, and the rollout task then only seals the round; locally it runs the shards in turn."""
    if run.config.rollout.runner == "ray" and not is_complete(run.layout.rollouts(round_)):
        shards_on_ray(run, "rollout", round_)
    return stages.rollout(run, round_)


def evaluate(run: Run, version: int) -> dict:
    """Version `version`'s evaluation, its shards on Ray first like a round's rollout."""
    if run.config.rollout.runner == "ray" and not is_complete(run.layout.eval(version)):
        shards_on_ray(run, "evaluate", version)
    return stages.evaluate(run, version)


def run_round(run: Run, round_: int) -> dict:
    """One round: rollout (v_r) -> score -> train (v_r+1) -> evaluate (v_r+1) -> report. A
    campaign whose v0 solves nothing and whose round 0 has no spread stops there (CampaignStopped)."""
    rollout(run, round_)
    score_and_train(run, round_)
    evaluate(run, round_ + 1)
    return stages.report(run, round_)


def score_and_train(run: Run, round_: int) -> None:
    """Round r's scoring and training, its rollout complete. A scorer that failed at half the
    nodes, or a campaign whose v0 solves nothing and whose round 0 has no spread, stops the
    campaign there (CampaignStopped)."""
    if why := campaign.broken_scorer(run, round_):
        raise campaign.CampaignStopped(why)
    stages.score(run, round_)
    if round_ == 0 and (why := campaign.hopeless_start(run)):
        raise campaign.CampaignStopped(why)
    stages.train(run, round_)


@flow(name="rao-train", log_prints=True)
def train_flow(config: str | None = None, overrides: list[str] | None = None) -> dict:
    """The main job: synthesize, warm start, evaluate v0, then `campaign.rounds` rounds (of the
    single-agent control arm too, with `campaign.control_arm`)."""
    run = _run(config, overrides)
    arms = run.arms()
    with writing(arms, "rao train"):
        for arm in arms:
            stages.synthesize(arm)
        stopped = _rounds(run, arms)
    if stopped:
        stages.log_lines(f"WARNING: {stopped}")
        return {**report.campaign_summary(run), "stopped": stopped}
    return report.campaign_summary(run)


def _rounds(run: Run, arms: list[Run]) -> str | None:
    """Warm start and v0 of every arm, then the rounds, the arms interleaved (overlapped with
    campaign.max_staleness >= 1). Returns why the campaign stopped early, if it did."""
    # MLflow: RUNNING, then FINISHED / FAILED / KILLED; a vLLM server lives as long as the campaign
    with tracking.campaign_status([a.tracker for a in arms]), campaign.engines(run), ray_session(run):
        for arm in arms:
            stages.warm_start(arm)
            stages.log_baseline(arm, evaluate(arm, 0))
        if run.config.campaign.max_staleness:
            return _overlapped_rounds(run, arms)
        for r in range(run.config.campaign.rounds):
            try:
                for arm in arms:  # interleaved, so both learning curves grow side by side
                    run_round(arm, r)
            except campaign.CampaignStopped as e:
                stages.campaign_report(run)
                return str(e)
            stages.campaign_report(run)
    return None


def _overlapped_rounds(run: Run, arms: list[Run]) -> str | None:
    """campaign.max_staleness >= 1: the engine lane (a task on a thread of its own: every rollout
    and evaluation, in order, each once the version it samples with exists, and each round's
    report once its new version is evaluated) beside the trainer (this thread: scoring and
    training, round after round). docs/overlap.md."""
    campaign.check_overlap(run.config.policy, run.config.train, run.config.campaign.max_staleness)
    cfg = run.config.campaign
    first = min(arm.layout.completed_rounds() for arm in arms)
    for arm in arms:  # rounds a killed run completed but did not report
        for r in range(first):
            if not arm.layout.logged(r).is_file():
                stages.report(arm, r)
    lane = campaign.LaneState()
    future = engine_lane.submit(run, first, lane)
    lane_ended = lane.ended(future.wrapped_future.done)
    stopped = None
    try:
        for r in range(first, cfg.rounds):
            for arm in arms:
                campaign.wait_until(
                    lambda arm=arm, r=r: arm.layout.complete(arm.layout.rollouts(r)),
                    f"{arm.name}'s round {r} rollout", cfg.wait_timeout_s, lane_ended,
                )  # fmt: skip
                score_and_train(arm, r)
        future.result()  # the last versions' evaluations and reports
    except campaign.CampaignStopped as e:
        stopped = str(e)
    except campaign.LaneStopped:
        if not lane.campaign_stop:  # the lane failed: its error is the campaign's
            raise
        stopped = lane.campaign_stop[0]
    finally:
        lane.stop.set()  # the lane ends its job at once: what it samples now is not needed
        interrupts.cancel_loops()
        concurrent.futures.wait([future.wrapped_future])  # (its outcome is the lane's, not ours)
    if stopped:
        stages.campaign_report(run)  # once the lane, which reports too, has ended
    return stopped


@task(name="engine-lane", cache_policy=NO_CACHE)
def engine_lane(run: Run, first: int, lane: campaign.LaneState) -> None:
    """Every rollout and new version's evaluation of rounds first.., each once its version exists
    (campaign.engine_jobs), for every arm; the rounds whose new version is evaluated are reported
    when the lane would wait anyway (off both lanes' paths). Beside the trainer."""
    evaluated: list[int] = []  # rounds whose new version is evaluated, reported while the lane waits
    try:
        arms, cfg = run.arms(), run.config.campaign
        with interrupts.stoppable(lane.stop), runlock.lane([a.dir for a in arms]):
            for job in campaign.engine_jobs(first, cfg.rounds, cfg.max_staleness):
                for arm in arms:
                    if evaluated and not campaign.checkpoint_ready(arm, job.needs):
                        _report(run, evaluated)
                    campaign.wait_until(
                        lambda arm=arm, v=job.needs: campaign.checkpoint_ready(arm, v),
                        f"{arm.name}'s version {job.needs}", cfg.wait_timeout_s, lane.stopped,
                    )  # fmt: skip
                    (rollout if job.kind == "rollout" else evaluate)(arm, job.index)
                    if job.kind == "evaluate" and (why := campaign.broken_evaluation(arm, job.index)):
                        lane.campaign_stop.append(why)
                        raise campaign.CampaignStopped(why)
                if job.kind == "evaluate":
                    evaluated.append(job.index - 1)
            _report(run, evaluated)
    except BaseException as e:
        if lane.stop.is_set() and not interrupts.received():
            return  # the trainer ended the campaign (or failed): its outcome is the campaign's
        lane.error.append(f"the engine lane failed: {type(e).__name__}: {e}"[:500])
        raise


def _report(run: Run, rounds: list[int]) -> None:
    """Report these rounds of every arm, then the campaign (and forget them)."""
    for r in rounds:
        for arm in run.arms():
            stages.report(arm, r)
    stages.campaign_report(run)
    rounds.clear()


@flow(name="rao-round", log_prints=True)
def round_flow(config: str | None = None, overrides: list[str] | None = None) -> dict:
    """One more round on the latest checkpoint (what the schedule runs)."""
    run = _run(config, overrides)
    arms = run.arms()
    metrics = []
    with writing(arms, "rao round"):
        for arm in arms:
            stages.synthesize(arm)
        with tracking.campaign_status([a.tracker for a in arms]), campaign.engines(run), ray_session(run):
            for arm in arms:
                stages.warm_start(arm)
                metrics.append(run_round(arm, arm.layout.completed_rounds()))
            stages.campaign_report(run)
    return metrics[0]


@flow(name="rao-rollout", log_prints=True)
def rollout_flow(config: str | None = None, overrides: list[str] | None = None, round_: int = 0) -> str:
    """Round `round_`'s rollout (with that round's policy checkpoint), on Ray with
    `rollout.runner=ray`: the scale-out path without training."""
    run = _run(config, overrides)
    with writing([run], "rao rollout"), campaign.engines(run), ray_session(run):
        stages.synthesize(run)
        return rollout(run, round_)


@flow(name="rao-synthesize")
def synthesize_flow(config: str | None = None, overrides: list[str] | None = None) -> str:
    run = _run(config, overrides)
    with writing([run], "rao synth"):
        return stages.synthesize(run)


@flow(name="rao-evaluate", log_prints=True)
def evaluate_flow(
    config: str | None = None, overrides: list[str] | None = None, version: int = -1, compare: bool = False
) -> dict:
    """Evaluate a policy version (default: the latest) on held-out tasks; with `compare`, in
    single and recursive mode at every context limit of eval.modes x eval.context_limits."""
    run = _run(config, overrides)
    with writing([run], "rao eval"), campaign.engines(run), ray_session(run):
        stages.synthesize(run)
        stages.warm_start(run)
        version = run.layout.completed_rounds() if version < 0 else version
        if compare:
            return stages.compare(run, version)
        return evaluate(run, version)
