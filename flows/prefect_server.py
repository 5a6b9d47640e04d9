"""The temporary Prefect server a `rao` command's flow reports to, when no server is configured.

Prefect starts one by itself (its "ephemeral" server) in the command's process group, so a
terminal's Ctrl-C stopped the server first, and the flow then spent minutes retrying its reports
("Error logging to API"). This one is the same server (`prefect.server.api.server:create_app`
under uvicorn, as Prefect runs it) in a session of its own: it outlives the interrupt long enough
to record how the flow run ended, then the command stops it. A command killed outright (SIGKILL)
runs no `finally`: the server's watchdog (rao_core/watchdog.py) then ends it within a second.
With `PREFECT_API_URL` set (a `prefect server start` of your own, Prefect Cloud), that server is
used and nothing is started.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import prefect
from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

from rao_core import interrupts
from rao_core.watchdog import WATCHDOG

START_TIMEOUT_S = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", 120))


@contextlib.contextmanager
def temporary_server() -> Iterator[None]:
    """A Prefect server for the block's flows: the configured one, or one started (and stopped)
    here. Ctrl-C while it starts stops it too."""
    if PREFECT_API_URL.value():
        yield
        return
    Path(PREFECT_HOME.value()).mkdir(parents=True, exist_ok=True)  # its database lives there
    proc, url = None, ""
    try:
        interrupts.note(stage := "the start of the temporary Prefect server")
        for _ in range(3):  # as Prefect does: another port when this one was taken meanwhile (exit 3)
            proc, url = _start()
            interrupts.pause_at(stage)
            if _wait_healthy(proc, url):
                break
        else:
            raise RuntimeError("the temporary Prefect server found no free port in 3 tries")
        with temporary_settings(updates={PREFECT_API_URL: url}):
            try:
                yield
            finally:
                _drain()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _start() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(WATCHDOG), str(os.getpid()), "--grace", "5", "--",
         sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent),
         "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "error", "--lifespan", "on"],
        env={**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
             "PREFECT__SERVER_FINAL": "1"},
        start_new_session=True,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}/api"


def _wait_healthy(proc: subprocess.Popen, url: str) -> bool:
    """True once the server answers; False if it exited for want of its port (code 3)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() == 3:
            return False
        if proc.poll() is not None:
            raise RuntimeError(f"the temporary Prefect server exited with code {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return True
        time.sleep(0.1)
    raise RuntimeError(
        f"the temporary Prefect server did not answer within {START_TIMEOUT_S:g} s "
        "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)"
    )


def _drain(timeout: float = 5.0) -> None:
    """Send the logs and events still queued before the server stops."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=timeout)
