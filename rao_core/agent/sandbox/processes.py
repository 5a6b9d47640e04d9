"""Worker processes for the sandbox: exec'd one by one, or forked from a preloaded zygote.

A zygote is a worker that has imported everything once and forks fresh workers on request, about
10x cheaper than exec'ing Python; `set_start_method("exec")` starts each worker from scratch. Either
way the orchestrator knows each worker by a pidfd (or its own Popen), so a pid is never reused
under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

WORKER = str(Path(__file__).with_name("worker.py"))


class SandboxError(RuntimeError):
    """A worker could not be started."""


# --- worker processes ----------------------------------------------------------------------------
class WorkerProc:
    """A worker process. Exec'd by us (popen): we reap it, so until then its pid and pgid cannot be
    reused. Forked by the zygote (pidfd): the zygote reaps it, and the pidfd never names another."""

    def __init__(self, pid: int, popen: subprocess.Popen | None = None, pidfd: int = -1) -> None:
        self.pid, self.popen, self.pidfd = pid, popen, pidfd

    def exited(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is not None
        if self.pidfd < 0:
            return True
        poll = select.poll()  # not select(): pidfds of a busy orchestrator go past 1024
        poll.register(self.pidfd, select.POLLIN)
        return bool(poll.poll(0))

    def exit_code(self) -> int | None:
        return self.popen.returncode if self.popen is not None else None  # the zygote keeps its own

    def kill(self) -> None:
        if self.exited():  # (reaps an exec'd zombie) from here on its pid cannot be reused
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            if self.popen is not None:
                os.kill(self.pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def release(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


async def wait_exit(proc: WorkerProc, timeout: float) -> bool:
    deadline, delay = time.monotonic() + timeout, 0.001
    while not proc.exited():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.05)
    return True


@functools.cache
def _pyseccomp_dir() -> str | None:
    spec = importlib.util.find_spec("pyseccomp")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def _worker_argv(*extra: str) -> list[str]:
    """-S skips site (20 ms); pyseccomp's folder is passed explicitly instead."""
    argv = [sys.executable, "-I", "-S", WORKER, "--ppid", str(os.getpid()), *extra]
    return argv + ["--path", _pyseccomp_dir()] if _pyseccomp_dir() else argv


def _spawn(argv: list[str], stdin: int, stdout: int) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdin=stdin, stdout=stdout, stderr=subprocess.DEVNULL, env={}, cwd="/", start_new_session=True
    )


def _exec_worker() -> tuple[WorkerProc, int, int]:
    child_in, to_worker = os.pipe()
    from_worker, child_out = os.pipe()
    try:
        popen = _spawn(_worker_argv(), child_in, child_out)
    except BaseException:
        for fd in (to_worker, from_worker):
            os.close(fd)
        raise
    finally:
        os.close(child_in), os.close(child_out)
    return WorkerProc(popen.pid, popen=popen), from_worker, to_worker


class _Zygote:
    """A worker process with everything imported that forks new workers on request. A request is a
    4-byte id on a SOCK_SEQPACKET socket; the reply is the id and the pid, with the worker's socket
    and a pidfd attached (SCM_RIGHTS). Ids let concurrent and cancelled starts sort themselves out."""

    def __init__(self) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.popen = _spawn(_worker_argv("--zygote"), theirs.fileno(), subprocess.DEVNULL)
        finally:
            theirs.close()
        self.sock.setblocking(False)
        self.owner = os.getpid()  # a forked orchestrator must not share our zygote
        self.waiters: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock: asyncio.Lock | None = None

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.sock.fileno() >= 0 and self.popen.poll() is None

    async def fork(self) -> tuple[WorkerProc, int, int]:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # first use, or a new event loop (e.g. one asyncio.run per test)
            if self.waiters:
                raise SandboxError("zygote in use by another event loop")
            if self.loop is not None and not self.loop.is_closed():
                self.loop.remove_reader(self.sock.fileno())
            loop.add_reader(self.sock.fileno(), self._on_reply)
            self.loop, self.lock = loop, asyncio.Lock()
        self.next_id += 1
        rid, fut = self.next_id, loop.create_future()
        self.waiters[rid] = fut
        try:
            async with self.lock:  # type: ignore[union-attr]  # one writer: sock_sendall is not reentrant
                await loop.sock_sendall(self.sock, struct.pack(">i", rid))
            return await fut
        finally:
            self.waiters.pop(rid, None)

    def _on_reply(self) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.sock, 8, 2, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return
        except OSError:
            msg, fds = b"", []
        if len(msg) != 8:
            return self.close()
        rid, pid = struct.unpack(">ii", msg)
        fut = self.waiters.pop(rid, None)
        if pid <= 0 or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            if fut is not None and not fut.done():
                fut.set_exception(SandboxError("the zygote could not fork a worker"))
            return
        proc = WorkerProc(pid, pidfd=fds[1])
        if fut is None or fut.done():  # the starter was cancelled meanwhile: nobody wants this worker
            proc.kill(), proc.release(), os.close(fds[0])
        else:
            fut.set_result((proc, fds[0], fds[0]))

    def close(self) -> None:
        """Kill the zygote; its workers die with it (PDEATHSIG)."""
        if self.loop is not None and not self.loop.is_closed() and self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for fut in self.waiters.values():
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_exception(SandboxError("the zygote died"))
        self.waiters.clear()
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


_method = "zygote"
_zygote: _Zygote | None = None


def set_start_method(method: str) -> None:
    """'zygote' (default: fork a preloaded worker) or 'exec' (a fresh interpreter per worker)."""
    global _method
    if method not in ("zygote", "exec"):
        raise ValueError(f"unknown start method {method!r}")
    _method = method


async def new_worker() -> tuple[WorkerProc, int, int]:
    global _zygote
    if _method == "exec":
        return _exec_worker()
    if _zygote is None or not _zygote.alive():
        if _zygote is not None and _zygote.owner == os.getpid():
            _zygote.close()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # 2 fds per worker: allow thousands
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 1 << 20)), hard))
        _zygote = _Zygote()
    return await _zygote.fork()


def close_zygote() -> None:
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None
