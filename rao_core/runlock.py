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
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from rao_core import interrupts
from rao_core.layout import RunLayout

_HELD: dict[Path, tuple[IO[str], dict[str, Any]]] = {}  # run folder -> (open lock file, record)
_LANES: dict[Path, dict[int, list]] = {}  # run folder -> thread -> [stage, progress, when noted]
_NOTING = threading.Lock()  # both lanes note their stages into one record


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
            return _read_record(f)
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def _read_record(f: IO[str], tries: int = 20) -> dict[str, Any]:
    """The holder's record. It is rewritten in place as the holder's stage moves on, so a read
    may land between the truncation and the write: read again, briefly."""
    for _ in range(tries):
        f.seek(0)
        with contextlib.suppress(json.JSONDecodeError):
            if text := f.read().strip():
                return json.loads(text)
        time.sleep(0.01)
    return {"pid": "?", "command": "?", "stage": "?", "since": 0}


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
            other = _read_record(f)
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
    interrupts.note(f"the start of {command}", key)
    try:
        yield
    finally:
        with _NOTING:
            del _HELD[key]
            _LANES.pop(key, None)
        f.truncate(0)
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def note_stage(run_dir: Path, stage: str) -> None:
    """Record the stage this thread is at (shown by `rao status`, in a refusal, and in the line an
    interrupted command ends with). When rounds overlap, the engine lane's thread and the
    trainer's each have theirs: the record shows both, `training of round 3 (step 2 of 4),
    rollout of round 4 (17 of 96 trees)`."""
    _note(run_dir, stage, None)


def note_progress(run_dir: Path, progress: str, every_s: float = 1.0) -> None:
    """Record how far this thread's stage is ("12 of 96 trees", "step 3 of 8"): written at most
    once every `every_s` seconds (and always the first time)."""
    key = Path(run_dir).resolve()
    lane = _LANES.get(key, {}).get(threading.get_ident())
    if lane is None:
        return
    now = time.monotonic()
    if lane[1] is not None and now - lane[2] < every_s:
        return
    _note(run_dir, lane[0], progress)


def _note(run_dir: Path, stage: str, progress: str | None) -> None:
    key = Path(run_dir).resolve()
    with _NOTING:
        held = _HELD.get(key)
        if held is None:
            return
        lanes = _LANES.setdefault(key, {})
        alive = {t.ident for t in threading.enumerate()}
        for thread in [t for t in lanes if t not in alive]:  # a lane that ended
            del lanes[thread]
        lanes[threading.get_ident()] = [stage, progress, time.monotonic()]
        shown = [f"{s} ({p})" if p else s for s, p, _ in lanes.values()]
        held[1]["stage"] = ", ".join(shown)
        _write(*held)
        interrupts.note(held[1]["stage"], key)
        mine = shown[list(lanes).index(threading.get_ident())]
    interrupts.pause_at(mine)


@contextlib.contextmanager
def lane(run_dirs: list[Path]) -> Iterator[None]:
    """A lane of the flow on a thread of its own (the engine lane): its stage leaves the records
    of these run folders when it ends (its pool's thread lives on)."""
    try:
        yield
    finally:
        with _NOTING:
            for run_dir in run_dirs:
                _LANES.get(Path(run_dir).resolve(), {}).pop(threading.get_ident(), None)


def _write(f: IO[str], record: dict[str, Any]) -> None:
    f.seek(0)
    f.truncate()
    f.write(json.dumps(record))
    f.flush()
