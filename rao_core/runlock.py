"""One writer per run folder: an exclusive lock on `<run>/RUN.lock`, naming who holds it.

Two writers on one run folder (an hourly `rao round` whose round outlasts the hour, a `rao eval`
started during training) would compute the same stages twice, and on a GPU run two servers and two
trainers on one card. Every command and flow that writes a run takes this lock first; a second
writer is refused in one line naming the holder (pid, command, stage, since when). The lock is an
advisory `flock`: the kernel releases it when the holder's process ends, however it ends, so a
killed run never leaves a stale lock. The file keeps the holder's record for `rao status`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from rao_core.layout import RunLayout

_HELD: dict[Path, tuple[IO[str], dict[str, Any]]] = {}  # run folder -> (open lock file, record)


class RunBusy(RuntimeError):
    """Another process writes this run folder."""


def holder(run_dir: Path) -> dict[str, Any] | None:
    """The record of the process that holds the run's lock, or None when it is free."""
    path = RunLayout(Path(run_dir)).lock
    if Path(run_dir).resolve() in _HELD:
        return _HELD[Path(run_dir).resolve()][1]
    if not path.is_file():
        return None
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = f.read()
            return (
                json.loads(text) if text.strip() else {"pid": "?", "command": "?", "stage": "?", "since": 0}
            )
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def describe(record: dict[str, Any]) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("since", 0)))
    return f"pid {record.get('pid')} ({record.get('command')}), stage {record.get('stage')}, since {since}"


@contextlib.contextmanager
def writing(
    run_dir: Path, command: str, wait: Callable[[str], None] | None = None, poll_s: float = 1.0
) -> Iterator[None]:
    """Hold the run's lock while the block runs. If another process holds it: RunBusy (one line),
    or with `wait`, tell `wait` once who holds it and take the lock when it is released (every
    writer of a folder queues behind the others, whatever started it: a schedule, the UI, a
    shell). Re-entrant within a process (a flow that calls another flow on the same run)."""
    key = Path(run_dir).resolve()
    if key in _HELD:
        yield
        return
    layout = RunLayout(key)
    key.mkdir(parents=True, exist_ok=True)
    f = open(layout.lock, "a+")  # noqa: SIM115 (held open for the block's life)
    told = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            f.seek(0)
            text = f.read()
            other = json.loads(text) if text.strip() else {"pid": "?", "command": "?", "stage": "?"}
            busy = f"{key} is being written by {describe(other)}"
            if wait is None:
                f.close()
                raise RunBusy(f"{busy}; wait for it to end") from None
            if not told:
                wait(f"{busy}; waiting for it to end (the folder's writers queue)")
                told = True
            time.sleep(poll_s)
    if told:
        wait(f"{key} is free: {command} starts")
    record = {"pid": os.getpid(), "command": command, "stage": "starting", "since": time.time()}
    _HELD[key] = (f, record)
    _write(f, record)
    try:
        yield
    finally:
        del _HELD[key]
        f.truncate(0)
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def note_stage(run_dir: Path, stage: str) -> None:
    """Record the stage this process is at (shown by `rao status` and in a refusal)."""
    held = _HELD.get(Path(run_dir).resolve())
    if held is not None:
        held[1]["stage"] = stage
        _write(*held)


def _write(f: IO[str], record: dict[str, Any]) -> None:
    f.seek(0)
    f.truncate()
    f.write(json.dumps(record))
    f.flush()
