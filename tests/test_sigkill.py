"""SIGKILL to a `rao` command, as a scheduler sends it (to the job's process group) or the OOM
killer (to the main process alone): no `finally` runs, and still within 10 s nothing the command
started is alive, its temporary folder is gone, and the next command finds the run folder free
(rao_core/watchdog.py).

Each case is a real command, killed once what it starts runs: its own temporary Prefect server
(no PREFECT_API_URL), the shipped model's engine processes, REPL workers, a training launcher and
its ranks, a local Ray instance, a vLLM server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from rao_core import runlock
from rao_core.interrupts import GRACE_S
from rao_core.run import load_config
from tests.test_interrupts import (
    DDP_CPU,
    ROOT,
    TOY_RUN,
    Interrupted,
    alive,
    interrupt,
    ranks_run,
    running,
    sets,
)

pytestmark = pytest.mark.slow  # each case is a `rao` process that starts a Prefect server: 15-60 s

GONE_WITHIN_S = 10.0
SERVER = "prefect.server.api.server:create_app"
WORKER = "sandbox/worker.py"


def own_server_env(tmp_path) -> dict[str, str]:
    """No PREFECT_API_URL, and a temporary folder (TMPDIR) that the test can check is left empty.
    Ray's session logs and torch's compile cache are meant to outlive the command: elsewhere."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect"), "HF_HUB_OFFLINE": "1",
            "TMPDIR": str(tmp_path / "tmp"), "RAY_TMPDIR": "/tmp",
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # fmt: skip


def left_in_tmp(tmp_path) -> list[str]:
    """What the killed command left in its TMPDIR GONE_WITHIN_S after its end (its reaper deletes
    the command's own folder, with vLLM's, torchrun's and multiprocessing's files in it)."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while os.listdir(tmp_path / "tmp") and time.monotonic() < deadline:
        time.sleep(0.2)
    return [str(p.relative_to(tmp_path)) for p in (tmp_path / "tmp").rglob("*")]


def runs_all(*needles: str):
    return lambda commands: all(any(n in c for c in commands) for n in needles)


def check_nothing_left(got: Interrupted, run_dir, tmp_path) -> None:
    assert got.code == -9, "\n".join(got.stderr[-30:])
    psutil.wait_procs(got.children, timeout=GONE_WITHIN_S)
    left = [c for p, c in zip(got.children, got.commands, strict=True) if alive(p)]
    assert not left, left
    assert runlock.holder(run_dir) is None
    assert not left_in_tmp(tmp_path)


@pytest.mark.parametrize("how", ["sigkill-group", "sigkill"])
def test_the_default_policy_on_its_own_prefect_server(tmp_path, how):
    """The shipped model: its engine processes, the trees' REPL workers, the temporary server."""
    ov = [f"runs_dir={tmp_path}", "campaign.rounds=1", "eval.num_tasks=4", "rollout.num_tasks=2"]
    until = runs_all(SERVER, "rao_core.engines.hf_process", WORKER)
    got = interrupt(["train", *sets(ov)], "", how, own_server_env(tmp_path), until=until)
    check_nothing_left(got, load_config(overrides=ov).run_dir, tmp_path)


def test_a_training_launcher_and_its_ranks(tmp_path):
    """train.accelerate_config: torchrun and its 2 ranks, in a session of their own, which a
    SIGKILL to the command's group does not reach (nor one to its main process)."""
    how = "sigkill-group"
    ov = [f"runs_dir={tmp_path}", *TOY_RUN, f"train.accelerate_config={DDP_CPU}"]
    got = interrupt(["train", *sets(ov)], "", how, own_server_env(tmp_path), until=ranks_run)
    check_nothing_left(got, load_config(overrides=ov).run_dir, tmp_path)


def test_a_local_ray_instance(tmp_path):
    """rollout.runner=ray: the local instance's GCS, raylet and agents (the agents outlive their
    driver's SIGKILL by themselves)."""
    ov = [
        f"runs_dir={tmp_path}",
        *TOY_RUN,
        "rollout.runner=ray",
        "rollout.shards=2",
        "rollout.num_tasks=2",
        "eval.num_tasks=2",
    ]
    until = runs_all("raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", SERVER)
    got = interrupt(["rollout", *sets(ov)], "", "sigkill", own_server_env(tmp_path), until=until)
    check_nothing_left(got, load_config(overrides=ov).run_dir, tmp_path)


@pytest.mark.vllm
def test_a_vllm_server(tmp_path, vllm_python):
    """policy.kind=vllm: the server, in a session of its own under its watchdog."""
    ov = [f"runs_dir={tmp_path}", "policy.kind=vllm", "rollout.num_tasks=2", "rollout.group_size=2",
          "tracking.enabled=false"]  # fmt: skip
    until = runs_all("vllm.entrypoints.openai.api_server", WORKER)
    got = interrupt(
        ["rollout", "--no-progress", *sets(ov)], "", "sigkill", own_server_env(tmp_path), until=until
    )
    check_nothing_left(got, load_config(overrides=ov).run_dir, tmp_path)
    # its own folder (sockets, vLLM's files) is in /tmp, TMPDIR being too long for a socket's path;
    # its watchdog deleted it
    server = next(c.split() for c in got.commands if "watchdog.py" in c and "api_server" in c)
    folder = server[server.index("--remove") + 1]
    assert folder.startswith("/tmp/rao-vllm-") and not os.path.exists(folder)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_bench_script_ends_the_way_rao_does(tmp_path, how):
    """bench/async_bench.py (its own Prefect server, flows, REPL workers), its output piped as in
    `... | grep`: SIGTERM ends it with one line and exit 143, SIGKILL leaves nothing running, and
    either way the pipe closes (a server left running held it open)."""
    bench = [sys.executable, str(ROOT / "bench" / "async_bench.py"), "--rounds", "2"]
    proc = subprocess.Popen(bench, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=own_server_env(tmp_path), start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not runs_all(SERVER, WORKER)(running(proc.pid)[1]):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.2)
        children, commands = running(proc.pid)
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        _, err = proc.communicate(timeout=GRACE_S + GONE_WITHIN_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if how == "sigterm":
        assert proc.returncode == 143, err[-3000:]
        assert err.strip().splitlines()[-1].startswith("interrupted (SIGTERM)"), err[-3000:]
    psutil.wait_procs(children, timeout=GONE_WITHIN_S)
    assert not [c for p, c in zip(children, commands, strict=True) if alive(p)]
    assert not left_in_tmp(tmp_path)
