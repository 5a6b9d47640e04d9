"""One writer per run folder: a second writer is refused in one line naming the holder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rao_core import runlock
from tests.conftest import TOY

HOLD = """
import sys, time
from pathlib import Path
from rao_core import runlock
with runlock.writing(Path(sys.argv[1]), "rao round"):
    runlock.note_stage(Path(sys.argv[1]), "training of round 3")
    print("held", flush=True)
    time.sleep(120)
"""


def wait_for_holder(run: Path, proc: subprocess.Popen, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while (record := runlock.holder(run)) is None or record.get("stage") == "starting":
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, "the first writer never took the lock"
        time.sleep(0.2)
    return record


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "r"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        record = runlock.holder(run)
        assert record["pid"] == holder.pid and record["stage"] == "training of round 3"
        with pytest.raises(runlock.RunBusy) as err, runlock.writing(run, "rao eval"):
            pass
        assert re.search(
            rf"pid {holder.pid} \(rao round\), stage training of round 3, since \d{{4}}-", str(err.value)
        )
    finally:
        holder.kill()
        holder.wait()
    assert runlock.holder(run) is None  # the kernel released it with the process: no stale lock
    with runlock.writing(run, "rao eval"):
        assert runlock.holder(run)["command"] == "rao eval"
        with runlock.writing(run, "a flow inside the command"):  # re-entrant in one process
            pass
    assert runlock.holder(run) is None


HOLD_BRIEFLY = (
    HOLD.replace("time.sleep(120)", "time.sleep(float(sys.argv[2]))") + 'print("released", flush=True)\n'
)


def test_a_writer_that_waits_queues_behind_the_holder(tmp_path):
    """With `wait`, a second writer says once who holds the folder, then takes it when it is free."""
    run = tmp_path / "r"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_BRIEFLY, str(run), "3"], stdout=subprocess.PIPE, text=True
    )
    said: list[str] = []
    try:
        assert holder.stdout.readline().strip() == "held"
        with runlock.writing(run, "rao round", wait=said.append, poll_s=0.1):
            assert holder.stdout.readline().strip() == "released"  # it ran only after the holder let go
            assert runlock.holder(run)["command"] == "rao round"
    finally:
        holder.kill()
        holder.wait()
    assert len(said) == 2 and f"is being written by pid {holder.pid} (rao round)" in said[0]
    assert "waiting for it to end" in said[0] and said[1].endswith("is free: rao round starts")


@pytest.mark.slow
def test_flows_queue_on_the_run_folder(tmp_path):
    """A flow started while another process writes its folder (a deployment triggered from the UI
    during a scheduled round) waits, with a line in its log, and then completes: no RunBusy."""
    import asyncio

    from prefect.testing.utilities import prefect_test_harness

    from flows.training import synthesize_flow
    from tests.test_flows import flow_run_logs

    hold = [sys.executable, "-c", HOLD_BRIEFLY, str(tmp_path / "default"), "4"]
    with prefect_test_harness(server_startup_timeout=120):
        holder = subprocess.Popen(hold, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            state = synthesize_flow(overrides=[f"runs_dir={tmp_path}", *TOY], return_state=True)
            assert state.is_completed() and holder.stdout.readline().strip() == "released"
            logs = asyncio.run(flow_run_logs(state.state_details.flow_run_id))
        finally:
            holder.kill()
            holder.wait()
    assert any("waiting for it to end" in line for line in logs), logs
    assert any("is free: rao synth starts" in line for line in logs), logs


@pytest.mark.slow
def test_two_rounds_at_once(tmp_path):
    """An hourly `rao round` whose round outlasts the hour: the second is refused at once, in one
    line, and `rao status` shows the round in progress."""
    sets = [a for o in [f"runs_dir={tmp_path}", *TOY, "policy.latency_s=0.3", "tracking.enabled=false",
                        "eval.num_tasks=1", "eval.difficulty=easy"] for a in ("--set", o)]  # fmt: skip
    rao = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    first = subprocess.Popen(
        [*rao, "round", *sets], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        record = wait_for_holder(tmp_path / "default", first)
        assert record["pid"] == first.pid and record["command"] == "rao round"
        second = subprocess.run([*rao, "round", *sets], capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 2
        (line,) = second.stderr.strip().splitlines()
        assert f"is being written by pid {first.pid} (rao round), stage " in line
        status = subprocess.run([*rao, "status", *sets], capture_output=True, text=True, env=env, timeout=120)
        assert f"in progress: pid {first.pid} (rao round), stage " in status.stdout
        assert first.wait(timeout=600) == 0, first.stderr.read()[-2000:]
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
            first.wait()
    assert runlock.holder(tmp_path / "default") is None
