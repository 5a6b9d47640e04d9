"""The training campaign through Prefect's local server, tracked in MLflow on SQLite.

A toy world and the untrained tiny model keep it fast: the point here is the plumbing (tables,
checkpoints, metrics, artifacts, resume), not learning, which the main job shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from rao_core import campaign, tracking
from rao_core.run import Run, control_config, load_config
from rao_core.stages.synthesize import prepare
from rao_core.stages.train import round_lr
from rao_core.store.parquet import is_complete
from rao_core.tracking import Tracker
from tasks import artifacts
from tests.conftest import TOY

pytestmark = pytest.mark.slow  # Prefect's local server, MLflow, SIGKILLed campaigns

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = [
    *TOY,
    "policy.kind=hf",
    "policy.model=tiny",
    "policy.engine_processes=0",  # the engine in the flow's process: no engine processes to start
    "agent.max_steps=2",
    "agent.max_new_tokens=12",
    "eval.num_tasks=1",
    "eval.difficulty=easy",
    "campaign.rounds=2",
    "train.lr=1e-3",
    "scoring.zero_advantage_groups=keep",  # an untrained model fails everything: train anyway
    "scoring.single_tree_groups=zero_baseline",
]


@pytest.fixture(scope="module")
def prefect_server():
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture(autouse=True)
def prefect_console_on_the_real_stderr():
    """Prefect's console handlers keep the stream they were made with: one made during a test
    that captured (capsys) would write to that test's closed stream in every later test."""
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler

    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler):
                handler.console.file = handler.stream = sys.__stderr__


def overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [f"runs_dir={tmp_path}", *CAMPAIGN, *extra]


async def flow_run_logs(flow_run_id) -> list[str]:
    """Every log line of a flow run and its task runs, as the UI's log tab shows them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    await APILogWorker.drain_all()  # logs reach the server in batches: send what is queued
    async with get_client() as c:
        logs = await c.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)
    return [log.message for log in logs]


def mlflow_runs(cfg):
    client = MlflowClient(Tracker.of(cfg).uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    return client, client.search_runs([exp.experiment_id])


def test_train_flow_end_to_end(prefect_server, tmp_path):
    from flows.training import train_flow

    ov = overrides(tmp_path, "train.lr_final=0.5")
    cfg = load_config(overrides=ov)
    state = train_flow(overrides=ov, return_state=True)
    summary = state.result()
    assert set(summary) == {"v0", "v1", "v2"}
    for r in (0, 1):
        rows = pq.read_table(cfg.run_dir / "rollouts" / f"round={r}" / "nodes.parquet").to_pylist()
        assert rows and all(row["policy_version"] == r and row["logprobs"] for row in rows)
        assert is_complete(cfg.run_dir / "scores" / f"round={r}")
        assert cfg.layout.checkpoint_complete(r + 1)
    assert [row["logged"] for row in campaign.status(Run(cfg))] == [True, True]

    client, runs = mlflow_runs(cfg)
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parent) == 1 and len(children) == 2
    history = client.get_metric_history(parent[0].info.run_id, "eval/all/success")
    assert sorted(m.step for m in history) == [0, 1, 2]
    child_metrics = children[0].data.metrics
    assert "train/loss" in child_metrics and "scores/mean_reward" in child_metrics
    assert 0 < child_metrics["train/served_changed"] <= 1 and child_metrics["train/update_rms_ratio"] > 0
    lrs = sorted(c.data.metrics["train/lr"] for c in children)  # the schedule reached the trainer
    assert lrs == pytest.approx([5e-4, 1e-3])
    assert "eval/easy/success" in child_metrics and "rollout/nodes_per_tree" in child_metrics
    logged = {a.path for a in client.list_artifacts(children[0].info.run_id)}
    assert {"eval", "scores", "checkpoint", "trees"} <= logged
    pages = [a.path for a in client.list_artifacts(children[0].info.run_id, "trees")]
    assert pages and all(p.endswith(".html") for p in pages)  # viewer pages of sampled trees
    reports = {a.path for a in client.list_artifacts(parent[0].info.run_id, "reports")}
    assert {
        "reports/learning_curves.png",
        "reports/depth_by_difficulty.png",
        "reports/delegation.png",
    } <= reports

    from prefect.client.orchestration import get_client

    async def artifact_keys():
        async with get_client() as c:
            return {a.key for a in await c.read_artifacts()}

    import asyncio

    keys = asyncio.run(artifact_keys())
    assert artifacts.artifact_key(Run(cfg), "round", 1) in keys
    assert artifacts.artifact_key(Run(cfg), "learning-curves") in keys

    # The campaign's MLflow run is closed, and each stage told the flow run's log what it did.
    assert client.get_run(parent[0].info.run_id).info.status == "FINISHED"
    logs = asyncio.run(flow_run_logs(state.state_details.flow_run_id))
    for pattern in (
        r"round 1 rollout: 4 trees, \d+ nodes, root success [\d.]+, max depth \d+, "
        r"policy failures \d+ nodes( \([^)]*\))?, scorer failures 0 nodes, other infrastructure failures 0 "
        r"nodes \(trees left out of training: 0\), [\d.]+ s",
        r"round 1 score: \d+ of \d+ nodes trained, 4 trees, \d+ of \d+ groups with spread; dropped trees by reason: ",
        r"round 1 train: loss -?[\d.]+, \d+ tokens \(\d+ action\), \d+ steps, mean ratio [\d.]+ \([\d.]+% clipped\), "
        r"trained nodes by staleness 0: \d+, sampler mismatch KL [\d.e+-]+, served weights changed [\d.]+%, "
        r"[\d.]+% since v0 \(float32\), update/weight RMS [\d.e+-]+, [\d.]+ s",
        r"v2 held-out success: easy [\d.]+, all [\d.]+",
    ):
        assert any(re.search(pattern, line) for line in logs), pattern

    # A second run of a finished campaign does nothing: no new rows, runs or checkpoints.
    stamp = (cfg.run_dir / "rollouts" / "round=1" / "nodes.parquet").stat().st_mtime_ns
    assert train_flow(overrides=ov) == summary
    assert (cfg.run_dir / "rollouts" / "round=1" / "nodes.parquet").stat().st_mtime_ns == stamp
    assert len(mlflow_runs(cfg)[1]) == 3


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_campaign_with_no_signal_stops_after_round_0(prefect_server, tmp_path, capsys, staleness):
    """The untrained model solves nothing: v0 at 0% and round 0 without spread end the campaign
    there, with a WARNING that says what to try, a non-zero exit, and the rounds' signal under the
    table; MLflow records the campaign FINISHED, not FAILED. With rounds that overlap, the engine
    lane (rolling out round 1 meanwhile) is stopped and the message is the same."""
    from flows.cli import main

    ov = overrides(
        tmp_path,
        "scoring.zero_advantage_groups=skip",
        "campaign.rounds=3",
        f"campaign.max_staleness={staleness}",
    )
    rc = main(["train", *(a for o in ov for a in ("--set", o))])
    out, err = capsys.readouterr()
    cfg = load_config(overrides=ov)
    assert rc == 1 and "stopped after round 0: v0 solves 0% of the held-out tasks" in err
    assert "Try: a warm start" in err and not cfg.layout.checkpoint_complete(1)
    assert re.search(r"Round 0's \d+ nodes ended: (budget|loop|context_overflow|finished) \d+ \(", err), err
    assert "groups with spread (what RL learns from), per round: r0 0/2" in out
    assert "1 of 1 rounds trained nothing (round 0: no group of 2 has spread (2 all failed))" in out
    _, runs = mlflow_runs(cfg)
    assert [r.info.status for r in runs if "mlflow.parentRunId" not in r.data.tags] == ["FINISHED"]


# A suite of the user's whose success() has the bug users write: a key that is not there.
BROKEN_SCORER = """
from usertasks_echo import EchoSuite, EchoEnv


class TypoEnv(EchoEnv):
    def success(self, finished, finish_message):
        return float(self.targets()["wrod"] == finish_message)


class Typo(EchoSuite):
    def env(self, task):
        return TypoEnv("say yes", "yes")
"""


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_broken_scorer_stops_the_campaign_with_its_message(
    prefect_server, tmp_path, capsys, monkeypatch, staleness
):
    """The scorer failed at every node of round 0: the campaign stops there with the scorer's own
    message (no advice about warm starts), exit status 1, and the round set aside for a rerun; the
    same when rounds overlap."""
    from flows.cli import main
    from tests.envs.test_suite_plugins import USER_SUITE

    (tmp_path / "usertasks_echo.py").write_text(USER_SUITE)
    (tmp_path / "brokenscorer.py").write_text(BROKEN_SCORER)
    monkeypatch.syspath_prepend(str(tmp_path))
    sets = [f"runs_dir={tmp_path}", "suite=brokenscorer:Typo", "policy.model=tiny", "agent.max_steps=2",
            "agent.max_new_tokens=12", "eval.num_tasks=1", "campaign.rounds=2",
            f"campaign.max_staleness={staleness}", "policy.engine_processes=0"]  # fmt: skip
    rc = main(["train", *(a for o in sets for a in ("--set", o))])
    err = capsys.readouterr().err
    assert rc == 1 and "stopped: the suite's scorer failed at 4 of 4 nodes of round 0, as at node" in err, err
    assert "raised KeyError: 'wrod'" in err and "Try: a warm start" not in err
    cfg = load_config(overrides=sets)
    assert not cfg.layout.checkpoint_complete(1) and list(
        (cfg.run_dir / "rollouts").glob(".scorer-failed-round=0-*")
    )


def test_control_arm_trains_beside_the_main_arm(prefect_server, tmp_path):
    """campaign.control_arm: the single-agent arm gets the same rounds in <run>-single, and the
    campaign report draws both learning curves."""
    from flows.training import train_flow

    ov = overrides(
        tmp_path, "campaign.rounds=1", "campaign.control_arm=true", "tracking.log_checkpoints=false"
    )
    cfg = load_config(overrides=ov)
    summary = train_flow(overrides=ov)
    assert set(summary) == {"v0", "v1"}
    control = control_config(cfg)
    rows = pq.read_table(control.run_dir / "rollouts" / "round=0" / "nodes.parquet").to_pylist()
    assert rows and {r["mode"] for r in rows} == {"single"} and {r["depth"] for r in rows} == {0}
    assert control.layout.checkpoint_complete(1)
    assert is_complete(control.layout.eval(1))
    curves = (cfg.run_dir / "reports" / "learning_curves.md").read_text()
    assert "recursive easy" in curves and "single easy" in curves


@pytest.mark.parametrize("rounds", [1, 2, 8])
def test_round_lr_goes_linearly_to_lr_final(rounds):
    cfg = load_config(overrides=[f"campaign.rounds={rounds}", "train.lr=1e-3", "train.lr_final=0.1"])
    lrs = [round_lr(Run(cfg), r) for r in range(rounds + 2)]  # two rounds past the campaign
    assert lrs[0] == pytest.approx(1e-3)
    if rounds > 1:
        step = (1e-4 - 1e-3) / (rounds - 1)
        assert lrs[:rounds] == pytest.approx([1e-3 + step * r for r in range(rounds)])
        assert lrs[rounds:] == pytest.approx([1e-4, 1e-4])  # added rounds keep the last value
    const = load_config(overrides=[f"campaign.rounds={rounds}", "train.lr=1e-3"])
    assert {round_lr(Run(const), r) for r in range(rounds + 2)} == {1e-3}


def test_a_run_folder_of_another_suite_is_refused(tmp_path, capsys):
    from flows.cli import main

    old = load_config(overrides=[f"runs_dir={tmp_path}", "suite=textcraft"])
    prepare(Run(old))  # e.g. an earlier `runs/default` of the reference suite
    before = sorted(p.name for p in old.run_dir.iterdir())
    assert main(["train", "--set", f"runs_dir={tmp_path}"]) == 2  # the default suite is textcraft-small
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: run_name:") and "holds a textcraft run" in err
    assert sorted(p.name for p in old.run_dir.iterdir()) == before  # nothing started


def test_bad_config_fails_before_any_work(tmp_path, capsys):
    from flows.cli import main

    assert main(["train", "--set", f"runs_dir={tmp_path}", "--set", "campaign.rounds=-1"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "config error: campaign.rounds: -1: input should be greater than or equal to 0"
    )
    assert list(tmp_path.iterdir()) == []


def _wait_for(path_fn, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if path_fn():
            return True
        time.sleep(0.2)
    return False


def test_kill_and_resume(prefect_server, tmp_path):
    """SIGKILL `rao train` during the rollout, the training and the evaluation of round 1, resume
    each time, and end with exactly the tables, checkpoints and MLflow runs of an unbroken run."""
    ov = overrides(tmp_path)
    cfg = load_config(overrides=ov)
    cmd = [sys.executable, "-m", "flows.cli", "train"] + [a for o in ov for a in ("--set", o)]
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "HF_HUB_OFFLINE": "1"}
    stops = [
        lambda: (cfg.run_dir / "rollouts").is_dir(),  # round 0 rollout under way (warm start done)
        lambda: is_complete(cfg.run_dir / "scores" / "round=0"),  # about to train round 0
        lambda: cfg.layout.checkpoint_complete(2),  # evaluating v2
    ]
    for stop in stops:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert _wait_for(stop, proc), "the run ended before the stage it was to be killed in"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    log = done.stdout + done.stderr  # the resumed run says what it reused, and does not re-report it
    assert "default round 0 rollout: reused" in log and "default round 0 rollout: 4 trees" not in log
    assert "default v1 evaluation: reused" in log and "default v1 held-out success" not in log
    for r in (0, 1):
        table = pq.read_table(cfg.run_dir / "rollouts" / f"round={r}" / "nodes.parquet")
        ids = table.column("node_id").to_pylist()
        assert len(ids) == len(set(ids)) > 0
    assert cfg.layout.completed_rounds() == 2
    assert all(row["logged"] for row in campaign.status(Run(cfg)))
    client, runs = mlflow_runs(cfg)
    assert len([r for r in runs if "mlflow.parentRunId" not in r.data.tags]) == 1
    assert len([r for r in runs if "mlflow.parentRunId" in r.data.tags]) == 2
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    steps = [m.step for m in client.get_metric_history(parent.info.run_id, "eval/all/success")]
    assert sorted(steps) == [0, 1, 2]  # each version evaluated and logged exactly once
    assert not list((cfg.run_dir / "rollouts").glob(".tmp-*"))


SUITES = {
    "oolong": [
        "suite_args.tasks_per_difficulty=2",
        "suite_args.difficulty_tokens={easy: [1024], medium: [2048]}",
        "suite_args.chunk_chars=2500",
        "agent.max_context_tokens=16384",
    ],
    "deepdive": ["suite_args.questions_per_difficulty=6", "agent.max_context_tokens=16384"],
}


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_other_suites_run_through_the_same_flow(prefect_server, tmp_path, suite):
    """Oolong and DeepDive through `rao-train` like TextCraft: scripted rollouts with mistakes
    (judged children, scored in SQL), one training round of the tiny model on them, evaluation,
    reports."""
    from flows.training import train_flow

    ov = [
        f"runs_dir={tmp_path}", f"suite={suite}", *SUITES[suite], "policy.kind=scripted", "policy.model=tiny",
        "policy.error_rate=0.3", "judge.kind=scripted", "rollout.difficulty=easy,medium", "rollout.num_tasks=1",
        "rollout.group_size=2", "eval.difficulty=easy", "eval.num_tasks=2", "campaign.rounds=1",
        "scoring.zero_advantage_groups=keep", "scoring.single_tree_groups=zero_baseline",
        "tracking.log_checkpoints=false", "agent.cell_timeout_s=10",
    ]  # fmt: skip
    cfg = load_config(overrides=ov)
    assert set(train_flow(overrides=ov)) == {"v0", "v1"}
    rows = pq.read_table(cfg.run_dir / "rollouts" / "round=0" / "nodes.parquet").to_pylist()
    assert {r["suite"] for r in rows} == {suite} and max(r["depth"] for r in rows) >= 1
    assert {r["success_source"] for r in rows if r["depth"] > 0} <= {"judge", "verifier"}
    assert is_complete(cfg.run_dir / "scores" / "round=0")
    assert cfg.layout.checkpoint_complete(1)
    assert (cfg.run_dir / "reports" / "learning_curves.png").is_file()


def test_serve_registers_every_flow_with_the_run_parameters():
    from flows.serve import deployments

    deps = {d.name: d for d in deployments("run.yaml", ["campaign.rounds=5"], 30)}
    assert set(deps) == {"train", "next-round", "evaluate", "compare", "rollout", "synthesize"}
    assert all(d.parameters["overrides"] == ["campaign.rounds=5"] for d in deps.values())
    assert deps["compare"].parameters["compare"] is True
    assert [s.schedule.interval.total_seconds() for s in deps["next-round"].schedules] == [1800.0]
    assert [s.active for s in deps["next-round"].schedules] == [True]
    assert not deps["train"].schedules
    assert deps["next-round"].concurrency_limit == deps["train"].concurrency_limit == 1  # one round at a time


def test_a_paused_schedule_stays_paused_when_serve_starts_again(prefect_server):
    """Pause the next-round schedule on the server (as the UI's toggle does); registering the
    deployments again, as `rao serve` does at start, keeps it paused."""
    import asyncio

    from prefect.client.orchestration import get_client

    from flows.serve import SCHEDULED, deployments, schedule_paused

    deps = {d.name: d for d in deployments(None, [], 30)}
    deps["next-round"].apply()
    assert not schedule_paused()

    async def pause() -> None:
        async with get_client() as client:
            d = await client.read_deployment_by_name(SCHEDULED)
            for sched in d.schedules:
                await client.update_deployment_schedule(d.id, sched.id, active=False)

    asyncio.run(pause())
    assert schedule_paused()
    again = {d.name: d for d in deployments(None, [], 30, paused=schedule_paused())}
    again["next-round"].apply()
    assert schedule_paused()  # still paused on the server after the new registration


def test_campaign_status_in_mlflow(tmp_path):
    """FINISHED when the campaign ends, FAILED on an error, KILLED on an interrupt, RUNNING again
    while rounds are added (real MLflow on SQLite)."""
    cfg = load_config(overrides=overrides(tmp_path))
    client = MlflowClient(Tracker.of(cfg).uri)
    run_id = Tracker.of(cfg).campaign_run_id()
    status = lambda: client.get_run(run_id).info.status  # noqa: E731
    with tracking.campaign_status([Tracker.of(cfg)]):
        assert status() == "RUNNING"
    assert status() == "FINISHED"
    with pytest.raises(RuntimeError), tracking.campaign_status([Tracker.of(cfg)]):
        assert status() == "RUNNING"  # reopened: a finished campaign gets more rounds
        raise RuntimeError("a stage failed")
    assert status() == "FAILED"
    with pytest.raises(KeyboardInterrupt), tracking.campaign_status([Tracker.of(cfg)]):
        raise KeyboardInterrupt
    assert status() == "KILLED"
    from prefect.exceptions import TerminationSignal  # SIGTERM inside a Prefect flow

    with pytest.raises(TerminationSignal), tracking.campaign_status([Tracker.of(cfg)]):
        raise TerminationSignal(signal=15)
    assert status() == "KILLED"


WARMSTART = [  # a warm start of about half a minute: tiny data, a short budget, no evaluation
    "warmstart.recursive_episodes=16", "warmstart.flat_episodes=16", "warmstart.max_minutes=0.25",
    "warmstart.drill_steps=20", "warmstart.eval_tasks=0", "warmstart.hidden=64", "warmstart.intermediate=128",
]  # fmt: skip


def test_a_warm_start_trained_inside_the_run(prefect_server, tmp_path):
    """policy.model=warmstart: the run trains its own version 0 with the warmstart.* settings
    (reachable with --set), rolls out from it and trains version 1 on top."""
    from flows.training import train_flow

    ov = [
        f"runs_dir={tmp_path}", "policy.model=warmstart", *WARMSTART, "rollout.num_tasks=2",
        "rollout.group_size=2", "rollout.difficulty=easy", "agent.max_steps=4", "eval.num_tasks=2",
        "eval.difficulty=easy", "campaign.rounds=1", "tracking.log_checkpoints=false",
        "scoring.zero_advantage_groups=keep", "scoring.single_tree_groups=zero_baseline",
    ]  # fmt: skip
    cfg = load_config(overrides=ov)
    state = train_flow(overrides=ov, return_state=True)
    assert set(state.result()) == {"v0", "v1"}
    logs = asyncio.run(flow_run_logs(state.state_details.flow_run_id))
    assert not [line for line in logs if "LOAD_" in line or "RETURN_VALUE" in line]  # no bytecode dumps
    v0 = cfg.run_dir / "checkpoints" / "warmstart" / "model"
    assert Run(cfg).checkpoints.initial() == v0 and cfg.layout.warmstart_complete()
    metrics = (cfg.run_dir / "checkpoints" / "warmstart" / "metrics.json").read_text()
    assert '"recursive_episodes": 16' in metrics and '"hidden": 64' in metrics  # the run's settings
    train = (cfg.layout.checkpoint(1) / "metrics.json").read_text()
    assert f'"model_path": "{v0}"' in train  # version 1 was trained from the run's own warm start


def servers_of_this_process() -> list[str]:
    """vLLM servers started by this process (each runs under a watchdog that names its parent)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        watched = any(a.endswith(b"watchdog.py") for a in argv) and str(os.getpid()).encode() in argv
        if watched and b"vllm.entrypoints.openai.api_server" in argv:
            found.append(proc.name)
    return found


@pytest.mark.vllm
def test_a_campaign_round_on_vllm(prefect_server, tmp_path, vllm_python):
    """policy.kind=vllm through rao-train: one server for the whole campaign, the new weights loaded
    and proven after the training round, log-probs the trainer agrees with, stopped at the end."""
    from flows.training import train_flow
    from rao_core.engines.scope import current_scope

    ov = [
        f"runs_dir={tmp_path}", "policy.kind=vllm", "rollout.num_tasks=3", "rollout.group_size=2",
        "rollout.difficulty=medium", "eval.num_tasks=2", "eval.difficulty=medium", "campaign.rounds=1",
        "tracking.log_checkpoints=false", "scoring.zero_advantage_groups=keep",
    ]  # fmt: skip
    cfg = load_config(overrides=ov)
    assert set(train_flow(overrides=ov)) == {"v0", "v1"}
    assert current_scope() is None and not servers_of_this_process()  # stopped with the campaign
    rows = pq.read_table(cfg.run_dir / "rollouts" / "round=0" / "nodes.parquet").to_pylist()
    assert rows and all(r["logprobs"] for r in rows) and {r["status"] for r in rows} != {"infra_error"}
    train = json.loads((cfg.layout.checkpoint(1) / "metrics.json").read_text())
    assert train["logprob_diff_mean"] < 1e-4 and train["mean_ratio"] == pytest.approx(1.0, abs=0.05)
    log = (cfg.run_dir / "logs" / "vllm.log").read_text()
    assert log.count("Starting vLLM server") == 1  # one server: v1 was loaded into it, not restarted
    client, runs = mlflow_runs(cfg)
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert "train/logprob_diff_p99" in child.data.metrics and "train/ratio_std" in child.data.metrics
