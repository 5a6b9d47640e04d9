"""Prefect across machines: `rao deploy --pool NAME` registers the flows on a process work pool of
a standing server, and `prefect worker start --pool NAME`, started in another folder as on
another machine, runs what is triggered through the API. The run folder is still the queue (a
train and a next-round triggered together both complete, one after the other), and a Cancel still
ends a run cleanly (state Cancelled, the folder free, nothing left running).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from rao_core import runlock
from rao_core.run import load_config
from tests.test_interrupts import TOY_RUN, sets

pytestmark = pytest.mark.slow  # a server, a worker and 3 flow runs: about 2 minutes here

ROOT = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).parent / "prefect")
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@pytest.fixture(scope="module")
def api():
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


def trigger(name: str, **job_variables) -> str:
    from prefect.deployments import run_deployment

    return str(run_deployment(name, timeout=0, job_variables=job_variables or None).id)


def state(run_id: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state.type.value


def wait_until(check, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_worker_runs_the_deployments_of_a_pool(api, tmp_path):
    pool = f"rao-test-{uuid.uuid4().hex[:6]}"
    ov = [f"runs_dir={tmp_path / 'runs'}", *TOY_RUN]
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_WORKER_QUERY_SECONDS": "1", "HF_HUB_OFFLINE": "1"}
    deployed = subprocess.run([sys.executable, "-m", "flows.cli", "deploy", "--pool", pool, *sets(ov)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    assert f"6 deployments on work pool {pool}" in deployed.stdout
    elsewhere = tmp_path / "worker"  # not the project folder: the worker imports the installed flows
    elsewhere.mkdir()
    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", pool], cwd=elsewhere, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    run_dir = load_config(overrides=ov).run_dir
    try:
        train = trigger("rao-train/train")
        wait_until(lambda: runlock.holder(run_dir) is not None, "the train run to take the folder")
        next_round = trigger("rao-round/next-round")  # waits for the folder
        wait_until(lambda: {state(train), state(next_round)} <= FINAL, "the train and next-round runs")
        assert (state(train), state(next_round)) == ("COMPLETED", "COMPLETED")
        assert load_config(overrides=ov).layout.completed_rounds() == 2  # one after the other

        held = trigger("rao-round/next-round", env={"RAO_PAUSE_AT_STAGE": "rollout of round 2"})
        at_rollout = lambda: (runlock.holder(run_dir) or {}).get("stage", "").startswith("rollout of round 2")  # noqa: E731
        wait_until(at_rollout, "the third run to hold at its rollout")
        children = psutil.Process(worker.pid).children(recursive=True)
        from prefect.client.orchestration import get_client
        from prefect.states import Cancelling

        with get_client(sync_client=True) as client:
            client.set_flow_run_state(held, Cancelling(), force=True)
        wait_until(lambda: state(held) in FINAL, "the cancelled run to end", timeout=120)
        assert state(held) == "CANCELLED"
        assert runlock.holder(run_dir) is None
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, 9)
            worker.wait()
