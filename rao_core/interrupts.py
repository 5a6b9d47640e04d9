"""Interrupts: a terminal's Ctrl-C, SIGINT to the process and SIGTERM end a command in seconds.

The `rao` command installs one handler for SIGINT and SIGTERM (`install`), whatever the process
inherited (a shell script's background job starts with SIGINT ignored, and Python's own handler
never sees SIGTERM). The first signal raises `Interrupted` (a KeyboardInterrupt) in the main
thread, wherever it is. Every `finally` and context manager on the way out then runs (engine
processes stopped, REPL workers ended, the MLflow run marked KILLED, the run folder's lock
released, partial outputs removed), and `rao` prints one line and exits 130 (143 for SIGTERM).
Completed stages are files marked complete, so the same command resumes after the last of them.

The trees' event loop (`run_async`) takes a signal differently, whoever handles it (this module,
Prefect's SIGTERM bridge in a served flow run, Python's Ctrl-C): it cancels the loop's main task,
so that every node closes its REPL worker and cancels its engine requests, and hands the signal
to that handler once the loop has ended. (Raised inside the loop, the exception would stop it
with those clean-ups half done.)

Two guarantees do not depend on the clean-up going well: a second signal, or `GRACE_S` seconds
after the first, ends every process this one started and exits at once (`stop_now`).

Child processes ignore SIGINT (the engine processes: a terminal sends it to the whole foreground
process group) or run in a session of their own (REPL workers, the vLLM server, the temporary
Prefect server, a training launcher and its ranks: `run_in_own_session`). Their parent stops
them, and each notices a parent killed outright: the engine processes by a closed pipe, REPL
workers by PR_SET_PDEATHSIG, and the rest through rao_core/watchdog.py, which ends a command's
whole process tree once its parent is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil

from rao_core import watchdog
from rao_core.layout import RunLayout

T = TypeVar("T")
GRACE_S = 20.0  # after the first signal: the clean-up's time before everything is killed
NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
PAUSE_AT = "RAO_PAUSE_AT_STAGE"


class Interrupted(KeyboardInterrupt):
    """The command was asked to stop: `signum` says by which signal, `stage` where it was."""

    def __init__(self, signum: int, stage: str | None = None) -> None:
        super().__init__(f"{NAMES.get(signum, signum)}" + (f" during {stage}" if stage else ""))
        self.signum, self.stage = signum, stage


_received: list[int] = []  # the signals `rao`'s handler received in this process
_where: dict[str, str] = {}  # the run folder written and its stage (runlock), for the exit line
_stage_at_signal: list[str] = []  # the stage when the first signal came (the exit line names it)
_in_loop: list[int] = []  # the signals the running `run_async` loop received
_installed: list[bool] = []  # whether `install` ran in this process
_unraisable_before: list[Callable[[Any], None]] = []  # sys.unraisablehook before `install`
_loops: dict[int, Callable[[], None]] = {}  # thread -> cancels its running `run_async` loop
_stops: dict[int, threading.Event] = {}  # thread -> its stop (`stoppable`)


def install() -> None:
    """Handle SIGINT and SIGTERM in this process from now on (main thread only; else a no-op)."""
    if threading.current_thread() is threading.main_thread():
        for signum in NAMES:
            signal.signal(signum, _on_signal)
        if sys.unraisablehook is not _unraisable:
            _unraisable_before[:] = [sys.unraisablehook]
            sys.unraisablehook = _unraisable
        _installed.append(True)


def check() -> None:
    """Raise Interrupted if `rao`'s handler took a signal in this process. The handler raises it in
    the main thread wherever that thread is, but when it runs inside a finalizer (a `__del__`, a
    generator closed by the garbage collector) Python drops the exception: the places a command
    passes often (a stage's start, a training step, a wait for the other lane) raise it again."""
    if _received:
        raise Interrupted(_received[0], stage_at_signal())


def _unraisable(unraisable: Any) -> None:
    """`sys.unraisablehook`: an Interrupted that a finalizer dropped is not printed as an ignored
    exception (a traceback); `check` raises it again at the next of those places."""
    if not isinstance(unraisable.exc_value, Interrupted):
        _unraisable_before[0](unraisable)


def reinstall() -> None:
    """After a library that takes the signals for itself (`ray.init` exits on SIGTERM): give them
    back to `rao`'s handler, where it was installed."""
    if _installed:
        install()


def note(stage: str, run_dir: Path | None = None) -> None:
    """Remember what the command is doing, and the run folder it writes (runlock notes each
    stage), for the line it ends with when interrupted."""
    _where["stage"] = stage
    if run_dir is not None:
        _where["run_dir"] = str(run_dir)


def pause_at(stage: str) -> None:
    """With RAO_PAUSE_AT_STAGE set to the start of `stage`, wait here for a signal: the hook by
    which a test interrupts exactly that stage (tests/test_interrupts.py)."""
    if (at := os.environ.get(PAUSE_AT)) and stage.startswith(at):
        print(f"paused at {stage} ({PAUSE_AT})", file=sys.stderr, flush=True)
        stop = _stops.get(threading.get_ident())
        while not (_received or _in_loop or (stop is not None and stop.is_set())):  # or a handler raises
            time.sleep(0.05)


def received() -> int | None:
    """The first signal `rao`'s handler received, or None."""
    return _received[0] if _received else None


def exit_code(signum: int) -> int:
    return 128 + signum  # 130 for SIGINT, 143 for SIGTERM: what a shell reports


def stage_at_signal() -> str | None:
    """The stage the command was at when the first signal came (both lanes' when rounds overlap:
    a lane that ends first leaves the record before the command's last line)."""
    return _stage_at_signal[0] if _stage_at_signal else _where.get("stage")


def exit_line(signum: int) -> str:
    """The one line an interrupted command ends with: where it stopped, and what is kept."""
    stage = stage_at_signal()
    said = f"interrupted ({NAMES.get(signum, signum)})" + (f" during {stage}" if stage else "")
    if "run_dir" not in _where:
        return f"{said}: no run folder was written yet"
    layout = RunLayout(Path(_where["run_dir"]))
    return f"{said}: {layout.root} keeps {layout.standing()}; the same command continues from there"


def count(signum: int) -> None:
    """`rao`'s bookkeeping of a signal: the second stops at once, the first starts the grace timer."""
    if not _received and "stage" in _where:
        _stage_at_signal.append(_where["stage"])
    _received.append(signum)
    if len(_received) > 1:
        stop_now(signum, "a second signal")
    timer = threading.Timer(GRACE_S, stop_now, (signum, f"the clean-up took over {GRACE_S:g} s"))
    timer.daemon = True
    timer.start()


def _on_signal(signum: int, frame: object) -> None:
    count(signum)
    cancel_loops()  # the engine lane's trees, when rounds overlap
    raise Interrupted(signum, stage_at_signal())


def cancel_loops() -> None:
    """Cancel the `run_async` loops running in other threads (the engine lane's, when rounds
    overlap): on a signal, or when the campaign's main thread stops."""
    me = threading.get_ident()
    for thread, cancel in list(_loops.items()):
        if thread != me:
            with contextlib.suppress(RuntimeError):  # that loop is closing: nothing left to cancel
                cancel()


@contextlib.contextmanager
def stoppable(stop: threading.Event) -> Iterator[None]:
    """In this thread, a `run_async` loop that starts once `stop` is set is cancelled at once (a
    loop already running is cancelled by `cancel_loops`)."""
    _stops[threading.get_ident()] = stop
    try:
        yield
    finally:
        _stops.pop(threading.get_ident(), None)


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, stoppable. In the main thread a SIGINT or SIGTERM meanwhile cancels
    `main`, waits for it to end, then goes to the handler it would have gone to (which raises:
    Interrupted, Prefect's TerminationSignal, KeyboardInterrupt); a signal left to the system's
    default is left alone. In another thread `cancel_loops` cancels it: it raises Interrupted after
    a signal, CancelledError otherwise."""
    displaced: dict[int, Callable] = {}
    got, thread = _in_loop, threading.get_ident()
    got.clear()

    def on_signal(signum: int, frame: Any) -> None:
        previous = displaced[signum]
        if previous is _on_signal:
            count(signum)  # a second signal stops at once
        elif got:
            previous(signum, frame)  # a second signal: that handler's way, now
        got.append(signum)
        cancel_loops()
        with contextlib.suppress(RuntimeError, KeyError):  # this loop is not running yet, or closing
            _loops[thread]()

    async def cancellable() -> T:
        task, loop = asyncio.current_task(), asyncio.get_running_loop()
        assert task is not None
        _loops[thread] = lambda: loop.call_soon_threadsafe(task.cancel)
        stop = _stops.get(thread)
        if got or _received or (stop is not None and stop.is_set()):  # it came while the loop started
            task.cancel()
        try:
            return await main
        finally:
            _loops.pop(thread, None)

    if threading.current_thread() is threading.main_thread():
        for signum in NAMES:
            if callable(handler := signal.getsignal(signum)):
                displaced[signum] = handler
                signal.signal(signum, on_signal)
    try:
        result = asyncio.run(cancellable())
    except asyncio.CancelledError:
        if not (got or _received):
            raise  # stopped by `cancel_loops`: the caller's error follows
    finally:
        for signum, handler in displaced.items():
            signal.signal(signum, handler)
    if got:  # cancelled (or done before the cancellation reached it): now the signal's handler
        if displaced[got[0]] is _on_signal:
            raise Interrupted(got[0], stage_at_signal())
        displaced[got[0]](got[0], None)
        raise KeyboardInterrupt(f"signal {got[0]}")  # a handler that did not raise
    if _received:  # a signal `rao` took in the main thread while this (another thread's) loop ran
        raise Interrupted(_received[0], stage_at_signal())
    return result


def stop_now(signum: int, why: str) -> None:
    """End every process this one started, say so in one line, and exit with the signal's code."""
    kill_descendants()
    print(f"interrupted ({NAMES.get(signum, signum)}): stopped at once ({why})", file=sys.stderr, flush=True)
    os._exit(exit_code(signum))


def run_script(main: Callable[[], object]) -> None:
    """A bench or tool script's entry point, ended the way `rao` ends: an interrupt prints one
    line and exits 130 or 143, and nothing the script started is left running, even after a
    SIGKILL (its reaper: rao_core/watchdog.py)."""
    install()
    watchdog.start_reaper()
    try:
        main()
    except KeyboardInterrupt:
        signum = received() or signal.SIGINT
        kill_descendants()
        stage = stage_at_signal()
        print(
            f"interrupted ({NAMES.get(signum, signum)})" + (f" during {stage}" if stage else ""),
            file=sys.stderr,
        )
        sys.exit(exit_code(signum))


def kill_descendants(timeout: float = 3.0) -> list[int]:
    """Terminate every process this one started (and theirs), then kill what is left after
    `timeout` seconds, then delete this process's own temporary folder and end its reaper
    (rao_core/watchdog.py). Returns the pids that were running."""
    children = [c for c in psutil.Process().children(recursive=True) if c.pid not in watchdog.reapers()]
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=timeout)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    watchdog.stop_reaper()
    return [c.pid for c in children]


def run_in_own_session(
    cmd: list[str], env: dict[str, str] | None = None, started: Callable[[], None] | None = None
) -> None:
    """`subprocess.run(cmd, check=True)`, with the child and everything it starts (a launcher's
    ranks) in a session of their own: on an interrupt or any error they are all ended together,
    and a terminal's Ctrl-C reaches them only through this process. `started` is called once the
    child runs."""
    watched = [
        sys.executable,
        str(watchdog.WATCHDOG),
        str(os.getpid()),
        "--kill",
        "--",
    ]  # SIGKILLed, this ends them
    proc = subprocess.Popen([*watched, *cmd], env=env, start_new_session=True)
    try:
        if started is not None:
            started()
        code = proc.wait()
    except BaseException:
        _end_session(proc)
        raise
    if code != 0:
        raise subprocess.CalledProcessError(code, cmd)


def _end_session(proc: subprocess.Popen) -> None:
    """Kill the child, its session and every process under it outright (a launcher would print a
    traceback for SIGTERM, and torchrun's ranks run in sessions of their own). The ranks write
    nothing that needs an ending: a checkpoint is built in a temporary folder, which the next
    attempt removes."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
