"""Orchestrator side of the sandboxed REPL: start a worker, run cells in it, serve its tool calls.

A Sandbox is one worker process (worker.py) behind rlimits and a seccomp filter; the orchestrator
only ever exchanges length-prefixed JSON frames with it (protocol.py) and kills it at the first
sign of trouble: a timeout, a malformed or oversized frame, a frame out of turn, EOF. A dead
sandbox stays dead; start a new one. See docs/sandbox.md for the layers and what they stop.

Workers come from processes.py: forked from a preloaded zygote (about 10x cheaper than exec'ing
Python) or, with set_start_method("exec"), exec'd one by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import keyword
import logging
import os
import signal
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rao_core.agent.sandbox import processes
from rao_core.agent.sandbox.processes import SandboxError, WorkerProc, new_worker, wait_exit
from rao_core.agent.sandbox.protocol import FrameDecoder, ProtocolError, encode
from rao_core.config import SandboxConfig

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0
EXTRA_CALLS = 100  # rejected calls past max_calls before a cell counts as runaway and is killed
Handler = Callable[[str, list, dict], Awaitable[Any]]


@dataclass
class CellResult:
    output: str  # stdout+stderr of the cell (capped) and a short traceback of its exception, if any
    status: str  # "ok" (ran, maybe raising inside the cell), "timeout" or "crashed" (worker killed)
    error: str | None  # one line when status != "ok"
    seconds: float


_live: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_logged_layers = False


async def shutdown_sandboxes() -> None:
    """Kill every live worker and the zygote (end of a run, end of a test session)."""
    for sb in list(_live):
        await sb.close()
    processes.close_zygote()


# --- the sandbox ---------------------------------------------------------------------------------
@dataclass
class _Cell:
    handler: Handler
    max_calls: int
    start: float
    calls: int = 0
    inflight: int = 0  # tool calls being served; the cell's clock stops meanwhile
    paused: float = 0.0
    pause_start: float = 0.0
    tasks: set = dataclasses.field(default_factory=set)


class Sandbox:
    """One REPL worker. Use from the event loop that started it; one cell at a time."""

    def __init__(self, proc: WorkerProc, rfd: int, wfd: int, tools: set[str]) -> None:
        self.alive = True
        self.layers: list[str] = []
        self._proc, self._rfd, self._wfd, self._tools = proc, rfd, wfd, tools
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder()
        self._wlock = asyncio.Lock()
        self._waiter: asyncio.Future = self._loop.create_future()  # the "ready" frame, then each "done"
        self._gone: asyncio.Future = self._loop.create_future()  # set once the channel breaks
        self._started = False
        self._cell: _Cell | None = None
        self._broken: str | None = None  # why the channel is unusable ("eof" or a protocol error)
        self._error: str | None = None  # one line returned by run_cell once dead
        self._closed = False
        os.set_blocking(rfd, False), os.set_blocking(wfd, False)
        self._loop.add_reader(rfd, self._on_readable)
        _live.add(self)

    @classmethod
    async def start(
        cls,
        sync_tools: list[str],
        async_tools: list[str],
        limits: SandboxConfig,
        variables: dict | None = None,
        echo: bool = False,
    ) -> Sandbox:
        """Start a worker; with `echo` a cell's trailing expression is printed (notebook style)."""
        names = [*sync_tools, *async_tools, *(variables or {})]
        bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n) or names.count(n) > 1]
        if bad:
            raise ValueError(f"bad or duplicate names for the REPL namespace: {bad}")
        tools = {"sync_tools": list(sync_tools), "async_tools": list(async_tools)}
        init = encode(
            {
                "type": "init",
                **tools,
                "limits": dataclasses.asdict(limits),
                "variables": variables or {},
                "echo": echo,
            }
        )
        sb = cls(*await new_worker(), tools=set(sync_tools) | set(async_tools))
        try:
            await sb._write(init)
            try:
                ready = await asyncio.wait_for(asyncio.shield(sb._waiter), START_TIMEOUT_S)
            except TimeoutError:
                raise SandboxError(f"REPL worker not ready after {START_TIMEOUT_S:g} s") from None
            if not isinstance(ready, dict) or ready.get("error"):
                error = ready.get("error") if isinstance(ready, dict) else await sb._death()
                raise SandboxError(f"REPL worker failed to start: {error}")
        except BaseException:
            await sb.close()
            raise
        sb._started = True
        sb.layers = [str(x) for x in ready.get("layers", [])]
        _log_layers(sb.layers, limits)
        return sb

    async def run_cell(
        self,
        code: str,
        handler: Handler,
        timeout: float,
        max_calls: int = 200,
        *,
        include_call_time: bool = False,
    ) -> CellResult:
        """Run one cell. `timeout` bounds the cell's own time: time while tool calls are being served
        (a launch_subagent may take minutes) does not count unless include_call_time=True."""
        t0 = time.monotonic()
        if self._cell is not None:
            raise RuntimeError("a cell is already running in this sandbox")
        if not self.alive:  # killed earlier, or died between cells
            self._error = self._error or await self._death()
            await self._terminate()
            return CellResult("", "crashed", self._error, time.monotonic() - t0)
        cell = self._cell = _Cell(handler, max_calls, self._loop.time())
        self._waiter = self._loop.create_future()
        try:
            await self._write(encode({"type": "cell", "code": code}))
            in_time = await self._wait(cell, timeout, include_call_time)
        except BaseException:  # cancelled mid-cell: the worker's state is unknown
            self._break("the cell was cancelled")
            raise
        finally:
            self._cell = None
            for task in cell.tasks:
                task.cancel()  # the cell is over: nobody will read these results
            if cell.tasks and (await asyncio.wait(cell.tasks, timeout=10.0))[1]:
                log.warning("tool handlers ignored cancellation for 10 s; leaving them running")
        seconds = time.monotonic() - t0
        if not in_time:
            self._break(f"cell timed out after {timeout:g} s; the REPL was killed")
            await self._terminate()
            return CellResult("", "timeout", self._error, seconds)
        if self._broken is not None:
            self._error = await self._death()
            await self._terminate()
            return CellResult("", "crashed", self._error, seconds)
        return CellResult(self._waiter.result()["output"], "ok", None, seconds)

    async def close(self) -> None:
        """Kill the worker (its process group too) and reap it. Idempotent."""
        if self._closed:
            return
        self._break("the REPL is closed")
        await self._terminate()

    def __del__(self) -> None:  # forgotten without close() (its loop is gone): do not leave it running
        if not getattr(self, "_closed", True):
            self._closed = True
            self._proc.kill()
            for fd in {self._rfd, self._wfd}:
                os.close(fd)

    # --- internals ------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data = os.read(self._rfd, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            return self._break("eof", kill=False)  # let it finish exiting so we can read its exit code
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as e:
            return self._break(f"{e} from worker")
        for msg in frames:
            if self._broken is None:
                self._on_frame(msg)

    def _on_frame(self, msg: dict) -> None:
        kind, cell = msg.get("type"), self._cell
        if kind == "call" and cell is not None:
            cid, name, args, kwargs = msg.get("id"), msg.get("name"), msg.get("args"), msg.get("kwargs")
            if not all(isinstance(v, t) for v, t in ((cid, int), (name, str), (args, list), (kwargs, dict))):
                return self._break("malformed call frame from worker")
            cell.calls += 1
            if cell.calls > cell.max_calls + EXTRA_CALLS:
                return self._break(f"runaway cell: more than {cell.max_calls + EXTRA_CALLS} tool calls")
            task = self._loop.create_task(self._serve(cell, cid, name, args, kwargs))
            cell.tasks.add(task)
            task.add_done_callback(cell.tasks.discard)
        elif not self._waiter.done() and (
            (kind == "ready" and not self._started and cell is None)
            or (kind == "done" and cell is not None and isinstance(msg.get("output"), str))
        ):
            self._waiter.set_result(msg)
        else:
            self._break(f"protocol violation ({str(kind)[:20]!r} frame out of turn) from worker")

    async def _serve(self, cell: _Cell, cid: int, name: str, args: list, kwargs: dict) -> None:
        if cell.calls > cell.max_calls:
            reply = {"ok": False, "error": f"call limit of {cell.max_calls} per cell reached"}
        elif name not in self._tools:
            reply = {"ok": False, "error": f"unknown tool {name!r}"}
        else:
            self._pause(cell, +1)
            try:
                reply = {"ok": True, "value": await cell.handler(name, args, kwargs)}
            except Exception as e:  # the cell sees the message only, never our traceback
                reply = {"ok": False, "error": str(e) or type(e).__name__}
            finally:
                self._pause(cell, -1)
        try:
            data = encode({"type": "result", "id": cid, **reply})
        except (TypeError, ValueError, ProtocolError) as e:
            log.warning("tool %s returned a value the REPL cannot receive: %s", name, e)
            data = encode(
                {"type": "result", "id": cid, "ok": False, "error": f"tool {name} returned a non-JSON value"}
            )
        await self._write(data)

    def _pause(self, cell: _Cell, delta: int) -> None:
        now = self._loop.time()
        if delta > 0 and cell.inflight == 0:
            cell.pause_start = now
        cell.inflight += delta
        if delta < 0 and cell.inflight == 0:
            cell.paused += now - cell.pause_start

    async def _wait(self, cell: _Cell, timeout: float, include_call_time: bool) -> bool:
        """Wait for "done" (or a break); False if the cell's clock ran out first."""
        while not self._waiter.done():
            now = self._loop.time()
            used = now - cell.start
            if not include_call_time:
                used -= cell.paused + (now - cell.pause_start if cell.inflight else 0.0)
            if used >= timeout:
                return False
            await asyncio.wait([self._waiter], timeout=timeout - used)
        return True

    async def _write(self, data: bytes) -> None:
        async with self._wlock:
            view = memoryview(data)
            while view and self._broken is None:
                try:
                    view = view[os.write(self._wfd, view) :]
                except BlockingIOError:
                    ready = self._loop.create_future()
                    self._loop.add_writer(self._wfd, lambda f=ready: f.done() or f.set_result(None))
                    try:
                        await asyncio.wait([ready, self._gone], return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        self._loop.remove_writer(self._wfd)
                except OSError:  # EPIPE: the worker is gone; the reader reports it
                    return

    def _break(self, reason: str, kill: bool = True) -> None:
        """Mark the channel unusable (first reason wins), stop reading, wake whoever waits."""
        if self._broken is None:
            self._broken = reason
            self._error = None if reason == "eof" else reason
            if not self._loop.is_closed():
                self._loop.remove_reader(self._rfd)
                self._gone.set_result(None)
        self.alive = False
        if kill:
            self._proc.kill()
        if not self._waiter.done():
            self._waiter.set_result(None)

    async def _death(self) -> str:
        """One line on why the worker is gone (waits a moment for it to exit by itself)."""
        if self._broken != "eof":
            return str(self._broken)
        if not await wait_exit(self._proc, 1.0):
            self._proc.kill()  # it closed its output but kept running
            await wait_exit(self._proc, 5.0)
        code = self._proc.exit_code()
        if code is None:
            return "REPL worker died"
        with contextlib.suppress(ValueError):
            return f"REPL worker died (exit code {code}, {signal.Signals(-code).name})"
        return f"REPL worker died (exit code {code})"

    async def _terminate(self) -> None:
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        self._proc.kill()
        if not await wait_exit(self._proc, 5.0):
            log.warning("REPL worker %d did not exit after SIGKILL", self._proc.pid)
        if not self._loop.is_closed():
            async with self._wlock:  # a pending write has seen the break: let it drop the fd first
                pass
        for fd in {self._rfd, self._wfd}:
            os.close(fd)
        self._proc.release()


def _log_layers(layers: list[str], limits: SandboxConfig) -> None:
    global _logged_layers
    if not _logged_layers:
        _logged_layers = True
        if limits.seccomp and "seccomp" not in layers:
            log.warning(
                "REPL sandbox WITHOUT seccomp (no pyseccomp/libseccomp): %s; cells can open files", layers
            )
        else:
            log.info("REPL sandbox layers: %s", layers)
