"""Ctrl-C, SIGINT and SIGTERM at every stage of `rao train`, `round`, `eval` and `rollout`: the
command ends in seconds, in one line (exit 130 or 143), with nothing it started left running, its
run folder's lock free and its MLflow run KILLED; the same command then resumes.

The moment of each signal is chosen by the stage the command has reached, not by a sleep: with
RAO_PAUSE_AT_STAGE the command waits at that stage's marker (rao_core/interrupts.py, `note`) and
says so on stderr, and the test signals it then. A terminal's Ctrl-C is SIGINT to the command's
whole process group; the others go to its main process alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from rao_core import runlock
from rao_core.interrupts import GRACE_S, PAUSE_AT
from rao_core.run import load_config
from rao_core.tracking import Tracker
from tests.conftest import TOY
from tests.test_flows import WARMSTART

pytestmark = pytest.mark.slow  # each case is a `rao` process: 10-40 s

RAO = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]
SIGNALS = {  # how: (signal, to the whole process group)
    "ctrl-c": (signal.SIGINT, True),
    "sigint": (signal.SIGINT, False),
    "sigterm": (signal.SIGTERM, False),
}
KILLS = {  # a scheduler's SIGKILL to the job's process group; the OOM killer's, to one process
    "sigkill-group": (signal.SIGKILL, True),
    "sigkill": (signal.SIGKILL, False),
}
TIMES: dict[str, float] = {}  # case -> seconds from the signal to the exit (printed at the end)


@dataclass
class Interrupted:
    code: int
    seconds: float
    stderr: list[str]
    children: list[psutil.Process]  # what the command ran when it was signalled
    commands: list[str]  # their command lines


def interrupt(
    args: list[str],
    stage: str,
    how: str,
    env: dict[str, str],
    until: Callable[[list[str]], bool] | None = None,
) -> Interrupted:
    """Run `rao ARGS`, wait until it holds at `stage` (and, with `until`, until the command lines
    of what it runs satisfy it), signal it `how`, and wait for it to end."""
    signum, group = {**SIGNALS, **KILLS}[how]
    proc = subprocess.Popen(
        [*RAO, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**env, PAUSE_AT: stage} if stage else env, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    paused = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "paused at " in line:
                paused.set()
        paused.set()  # it ended without pausing: the assertion below says so

    threading.Thread(target=read, daemon=True).start()
    if not stage:
        paused.set()  # no pause: `until` alone says when
    try:
        assert paused.wait(timeout=300) and proc.poll() is None, "\n".join(lines[-30:])
        assert not stage or any("paused at " in line for line in lines), "\n".join(lines[-30:])
        children, commands = running(proc.pid)
        while until is not None and not until(commands):
            assert proc.poll() is None, "\n".join(lines[-30:])
            time.sleep(0.1)
            children, commands = running(proc.pid)
        start = time.monotonic()
        (os.killpg if group else os.kill)(proc.pid, signum)
        proc.wait(timeout=GRACE_S + 30)  # the grace timer ends it by then, whatever happened
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)  # the reader's last lines
    return Interrupted(proc.returncode, seconds, lines, children, commands)


def running(pid: int) -> tuple[list[psutil.Process], list[str]]:
    """The processes `pid` started (and theirs), and their command lines."""
    children = psutil.Process(pid).children(recursive=True)
    commands = []
    for p in children:
        try:
            commands.append(" ".join(p.cmdline()))
        except psutil.NoSuchProcess:
            commands.append("(gone)")
    return children, commands


def check_clean_end(got: Interrupted, how: str, stage: str, run_dir: Path | None) -> None:
    """One line, the signal's exit code, no traceback, nothing left running, the lock free."""
    signum, _ = SIGNALS[how]
    text = "\n".join(got.stderr)
    assert got.code == 128 + signum, text[-3000:]
    for bad in ("Traceback", "Error logging to API", "stopped at once", "Task was destroyed"):
        assert bad not in text, text[-3000:]
    name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
    assert re.fullmatch(rf"interrupted \({name}\) during {re.escape(stage)}.*", got.stderr[-1]), got.stderr[
        -1
    ]
    if run_dir is not None:
        assert got.stderr[-1].endswith("the same command continues from there")
        assert runlock.holder(run_dir) is None
    left = [c for p, c in zip(got.children, got.commands, strict=True) if alive(p)]
    assert not left, left


def alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def campaign_status(cfg) -> str | None:
    """The MLflow status of the run's campaign run (None before it was made)."""
    tracker = Tracker.of(cfg)
    run_id = tracker.campaign_run_id()
    return None if run_id is None else MlflowClient(tracker.uri).get_run(run_id).info.status


@pytest.fixture(scope="module")
def prefect_env(tmp_path_factory):
    """One Prefect server for the module's commands (each would start its own otherwise)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect")
    with prefect_test_harness(server_startup_timeout=120):
        yield {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_HOME": str(home)}


@pytest.fixture(scope="module", autouse=True)
def print_times():
    yield
    for case, seconds in sorted(TIMES.items()):
        print(f"exit after the signal: {seconds:5.1f} s  {case}")


# The scripted toy, short trees. One campaign runs to its end first (`finished`); each case starts
# from a copy of its folder with the outputs of its stage and the ones after removed, so that the
# command resumes straight into that stage.
TOY_RUN = [*TOY, "agent.max_steps=4", "eval.num_tasks=1", "eval.difficulty=easy", "campaign.rounds=1",
           "rollout.num_tasks=1", "rollout.group_size=2", "rollout.difficulty=easy",
           "scoring.zero_advantage_groups=keep", "scoring.single_tree_groups=zero_baseline",
           "tracking.log_checkpoints=false"]  # fmt: skip
OUTPUTS = [  # a campaign's outputs in the order its stages write them (run folder paths)
    "eval/version=0", "rollouts/round=0", "scores/round=0", "checkpoints/version=1", "eval/version=1",
    "logged/round=0.json", "reports",
]  # fmt: skip
STAGES = {  # case: (command, the stage as its marker names it, the first output it lacks)
    "train-synthesis": ("train", "synthesis", None),
    "train-eval-v0-trees": ("train", "evaluation of version 0 (1 of", "eval/version=0"),
    "train-rollout-trees": ("train", "rollout of round 0 (1 of", "rollouts/round=0"),
    "train-scoring": ("train", "scoring of round 0", "scores/round=0"),
    "train-training-steps": ("train", "training of round 0 (step 1 of", "checkpoints/version=1"),
    "train-eval-v1": ("train", "evaluation of version 1", "eval/version=1"),
    "train-report": ("train", "report of round 0", "logged/round=0.json"),
    "round-rollout": ("round", "rollout of round 0", "rollouts/round=0"),
    "eval-trees": ("eval", "evaluation of version 0 (1 of", "eval/version=0"),
    "rollout-trees": ("rollout", "rollout of round 0 (1 of", "rollouts/round=0"),
}


def sets(options: list[str]) -> list[str]:
    return [a for o in options for a in ("--set", o)]


@pytest.fixture(scope="module")
def finished(prefect_env, tmp_path_factory) -> Path:
    """The toy campaign, run to its end: the runs folder each case copies."""
    root = tmp_path_factory.mktemp("finished")
    done = subprocess.run([*RAO, "train", *sets([f"runs_dir={root}", *TOY_RUN])], env=prefect_env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def resuming_at(finished: Path, dest: Path, first_missing: str | None) -> Path:
    """A copy of the finished runs folder without `first_missing` and every output after it."""
    if first_missing is None:
        return dest  # a new run: it starts with synthesis
    shutil.copytree(finished, dest)
    for part in OUTPUTS[OUTPUTS.index(first_missing) :]:
        path = dest / "default" / part
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return dest


def cases() -> list[tuple[str, str]]:
    """(stage, signal) pairs. Every stage with each signal is RAO_INTERRUPT_MATRIX=full (30 `rao`
    processes, about 8 minutes here); by default every stage with one signal, the signals taken in
    turn, and the trees' event loop (where most of a run's time goes) with all three: 12
    processes, each signal at four stages or more."""
    names = sorted(STAGES)
    if os.environ.get("RAO_INTERRUPT_MATRIX") == "full":
        return [(c, how) for c in names for how in sorted(SIGNALS)]
    hows = sorted(SIGNALS)
    turn = [(c, hows[i % len(hows)]) for i, c in enumerate(names)]
    inside = [("train-rollout-trees", how) for how in hows]
    return sorted(set(turn) | set(inside))


@pytest.mark.parametrize(("case", "how"), cases())
def test_a_toy_command_ends_cleanly_at_every_stage(prefect_env, finished, tmp_path, case, how):
    command, stage, first_missing = STAGES[case]
    runs = resuming_at(finished, tmp_path / "runs", first_missing)
    ov = [f"runs_dir={runs}", *TOY_RUN]
    got = interrupt([command, *sets(ov)], stage, how, prefect_env)
    TIMES[f"toy {case}, {how}"] = got.seconds
    cfg = load_config(overrides=ov)
    check_clean_end(got, how, stage, cfg.run_dir)
    if command in ("train", "round") and stage != "synthesis":
        assert campaign_status(cfg) == "KILLED"


def test_a_warm_start_trained_in_the_run_ends_cleanly(prefect_env, tmp_path):
    """policy.model=warmstart, signalled while its expert trees run (REPL workers up)."""
    ov = [f"runs_dir={tmp_path}", *TOY_RUN, "policy.model=warmstart", *WARMSTART]
    run_dir = load_config(overrides=ov).run_dir

    def expert_trees_run(commands: list[str]) -> bool:
        at = runlock.holder(run_dir) or {}
        return at.get("stage") == "warm start" and any("sandbox/worker.py" in c for c in commands)

    got = interrupt(["train", *sets(ov)], "", "sigterm", prefect_env, until=expert_trees_run)
    TIMES["toy train-warm-start, sigterm"] = got.seconds
    check_clean_end(got, "sigterm", "warm start", run_dir)
    assert not (run_dir / "checkpoints" / "warmstart" / "model").exists()


ROOT = Path(__file__).resolve().parents[1]
DDP_CPU = ROOT / "configs" / "accelerate" / "ddp-cpu.yaml"


def ranks_run(commands: list[str]) -> bool:
    """torchrun and its 2 ranks run (their watchdog's command line names the stage too)."""
    return sum("rao_core.train.stage" in c and "watchdog.py" not in c for c in commands) == 3


def test_a_launched_train_stage_ends_with_its_ranks(prefect_env, finished, tmp_path):
    """train.accelerate_config: the launcher and its ranks run in a session of their own; a
    terminal's Ctrl-C reaches them through the command, which ends them all."""
    runs = resuming_at(finished, tmp_path / "runs", "checkpoints/version=1")
    ov = [f"runs_dir={runs}", *TOY_RUN, f"train.accelerate_config={DDP_CPU}"]
    stage = "training of round 0 (launched"
    got = interrupt(["train", *sets(ov)], stage, "ctrl-c", prefect_env, until=ranks_run)  # torchrun, 2 ranks
    TIMES["toy train-training-launched, ctrl-c"] = got.seconds
    check_clean_end(got, "ctrl-c", stage, load_config(overrides=ov).run_dir)


def test_the_start_of_the_temporary_prefect_server(tmp_path):
    """No PREFECT_API_URL: the command starts its own server (in a session of its own, so that a
    terminal's Ctrl-C reaches it only through the command) and stops it when interrupted."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    stage = "the start of the temporary Prefect server"
    got = interrupt(["train", *sets([f"runs_dir={tmp_path}", *TOY_RUN])], stage, "ctrl-c", env)
    TIMES["the temporary Prefect server's start, ctrl-c"] = got.seconds
    assert any("prefect.server.api.server:create_app" in c for c in got.commands), got.commands
    check_clean_end(got, "ctrl-c", stage, None)
    assert got.stderr[-1].endswith("no run folder was written yet")


# The default policy (the shipped model, its engine processes, REPL workers): one round of 4 trees
# (trained on whatever their rewards), interrupted three times in three stages.
DEFAULT_RUN = ["campaign.rounds=1", "eval.num_tasks=1", "rollout.num_tasks=2", "rollout.group_size=2",
               "scoring.zero_advantage_groups=keep"]  # fmt: skip
DEFAULT_CASES = [  # (the stage, how), in the order the campaign reaches them
    ("rollout of round 0 (1 of", "ctrl-c"),
    ("training of round 0 (step 1 of", "sigterm"),
    ("evaluation of version 1 (1 of", "sigint"),
]


def test_the_default_policy_ends_cleanly_and_resumes(prefect_env, tmp_path):
    """Each run resumes after the stages the one before completed, and ends cleanly when signalled."""
    ov = [f"runs_dir={tmp_path}", *DEFAULT_RUN]
    cfg = load_config(overrides=ov)
    reused = [[], ["default v0 evaluation: reused"], ["round 0 rollout: reused", "round 0 score: reused"]]
    for (stage, how), resumed in zip(DEFAULT_CASES, reused, strict=True):
        got = interrupt(["train", *sets(ov)], stage, how, prefect_env)
        TIMES[f"default policy: {stage.split(' (')[0]}, {how}"] = got.seconds
        check_clean_end(got, how, stage, cfg.run_dir)
        assert campaign_status(cfg) == "KILLED"
        assert all(any(r in line for line in got.stderr) for r in resumed), (resumed, got.stderr[-20:])
        if stage.startswith(("rollout", "evaluation")):  # what the trees ran on, now ended
            assert sum("rao_core.engines.hf_process" in c for c in got.commands) == 2, got.commands
            assert any("sandbox/worker.py" in c for c in got.commands), got.commands


def flow_run_state(flow_run_id) -> str:
    from prefect.client.orchestration import get_client

    async def read() -> str:
        async with get_client() as client:
            return (await client.read_flow_run(flow_run_id)).state.type.value

    return asyncio.run(read())


def test_a_cancel_from_the_ui_ends_the_flow_run(prefect_env, finished, tmp_path):
    """`rao serve`, a run of the train deployment, and the UI's Cancel (the flow run set to
    Cancelling) while its trees run: the flow run ends Cancelled, with nothing it started left
    running, the folder free for the next run and the MLflow run KILLED."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    runs = resuming_at(finished, tmp_path / "runs", "rollouts/round=0")
    ov = [f"runs_dir={runs}", *TOY_RUN]
    cfg = load_config(overrides=ov)
    env = {**prefect_env, PAUSE_AT: "rollout of round 0 (1 of", "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 (closed below)
    serve = subprocess.Popen(
        [*RAO, "serve", *sets(ov)], env=env, stdout=log, stderr=log, start_new_session=True
    )
    try:
        flow_run = None
        while flow_run is None:  # the deployments exist once `rao serve` has registered them
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            with contextlib.suppress(Exception):
                flow_run = run_deployment("rao-train/train", timeout=0)
            time.sleep(0.5)
        while (record := runlock.holder(cfg.run_dir)) is None or "trees)" not in record["stage"]:
            assert flow_run_state(flow_run.id) not in ("COMPLETED", "FAILED", "CRASHED")
            time.sleep(0.2)  # until the flow run's process holds at its stage
        children, commands = running(record["pid"])
        children.append(psutil.Process(record["pid"]))
        commands.append("the flow run's process")

        async def cancel() -> None:  # what the UI's Cancel does
            async with get_client() as client:
                await client.set_flow_run_state(flow_run.id, Cancelling(), force=True)

        asyncio.run(cancel())
        start = time.monotonic()
        while (state := flow_run_state(flow_run.id)) != "CANCELLED":
            assert time.monotonic() - start < 120, state  # the runner's poll, then its kill
            time.sleep(0.5)
        TIMES["the UI's Cancel of a served flow run"] = time.monotonic() - start
    finally:
        os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C in `rao serve`'s terminal
        serve.wait(timeout=60)
        log.close()
    assert serve.returncode == 130, (tmp_path / "serve.log").read_text()[-3000:]
    left = [c for p, c in zip(children, commands, strict=True) if alive(p)]
    assert not left, left
    assert runlock.holder(cfg.run_dir) is None
    assert campaign_status(cfg) == "KILLED"
    assert any("sandbox/worker.py" in c for c in commands), commands
    served = (tmp_path / "serve.log").read_text()
    for bad in ("Traceback", "Task was destroyed", "Error logging to API"):
        assert bad not in served, served[-3000:]


@pytest.mark.vllm
def test_a_rollout_on_vllm_ends_with_its_server(tmp_path, vllm_python):
    """policy.kind=vllm: Ctrl-C while the trees run on the server; the server (in a session of its
    own, under its watchdog) is stopped with the command."""
    ov = [f"runs_dir={tmp_path}", "policy.kind=vllm", "rollout.num_tasks=2", "rollout.group_size=2",
          "tracking.enabled=false"]  # fmt: skip
    stage = "rollout of round 0 (1 of"
    got = interrupt(["rollout", "--no-progress", *sets(ov)], stage, "ctrl-c", dict(os.environ))
    TIMES["default policy on vLLM: rollout of round 0, ctrl-c"] = got.seconds
    assert any("vllm.entrypoints.openai.api_server" in c for c in got.commands), (
        got.commands,
        "\n".join(got.stderr[-30:]),
    )
    check_clean_end(got, "ctrl-c", stage, load_config(overrides=ov).run_dir)


@pytest.mark.slow
def test_a_rollout_on_ray_ends_with_its_workers(tmp_path):
    """rollout.runner=ray (a local Ray instance, 2 shards as Ray tasks): SIGTERM while the shards
    run in Ray's workers; Ray is shut down with the command."""
    ov = [f"runs_dir={tmp_path}", *TOY_RUN, "rollout.runner=ray", "rollout.shards=2", "rollout.num_tasks=2", "eval.num_tasks=2",
          "tracking.enabled=false"]  # fmt: skip
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    shards_run = lambda commands: any("ray::" in c and "rollout" in c for c in commands)  # noqa: E731
    got = interrupt(["rollout", *sets(ov)], "", "sigterm", env, until=shards_run)
    TIMES["toy rollout on Ray, sigterm"] = got.seconds
    check_clean_end(got, "sigterm", "rollout of round 0", load_config(overrides=ov).run_dir)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_two_overlapped_stages_end_together(prefect_env, finished, tmp_path, how):
    """campaign.max_staleness=1: round 0 trains while the engine lane rolls out round 1 (held at
    its first tree); one signal ends both lanes as promptly and cleanly as one."""
    runs = resuming_at(finished, tmp_path / "runs", "rollouts/round=0")
    ov = [f"runs_dir={runs}", *TOY_RUN, "campaign.max_staleness=1", "campaign.rounds=2"]
    run_dir = load_config(overrides=ov).run_dir

    def both_run(commands: list[str]) -> bool:
        stage = (runlock.holder(run_dir) or {}).get("stage", "")
        return "training of round 0" in stage and "rollout of round 1 (1 of" in stage

    stage = "rollout of round 1 (1 of"
    got = interrupt(["train", *sets(ov)], stage, how, prefect_env, until=both_run)
    TIMES[f"toy k=1, training and the next rollout at once, {how}"] = got.seconds
    check_clean_end(got, how, "training of round 0", run_dir)
    assert "rollout of round 1 (1 of" in got.stderr[-1]  # the line names both lanes' stages
    assert campaign_status(load_config(overrides=ov)) == "KILLED"
    assert not (run_dir / "rollouts" / "round=1" / "_COMPLETE").exists()
