"""REPL worker: runs model-written Python cells in a process of its own, behind rlimits and seccomp.

Run as `python -I worker.py [--ppid PID] [--path DIR]`: it speaks length-prefixed JSON frames on
fd 0 (in) and fd 1 (out) with the orchestrator (rao_core/agent/sandbox/client.py). It imports only
the standard library and pyseccomp, never rao_core, and it imports everything a cell may use BEFORE
the seccomp filter is installed, because afterwards it cannot open a file.

Life of a worker: init frame (tools, limits, variables) -> event loop -> rlimits -> seccomp ->
"ready" -> cell / done frames until EOF. `--zygote` makes it a fork server instead (see zygote()).
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import ctypes
import errno
import inspect
import io
import json
import linecache
import os
import resource
import signal
import socket
import struct
import sys
import time
import traceback
from collections import Counter
from typing import Any

if "--path" in sys.argv:  # lets the client run us with -S (no site: 20 ms faster) and still find pyseccomp
    sys.path.append(sys.argv[sys.argv.index("--path") + 1])
try:
    import pyseccomp
except Exception:  # missing module or missing libseccomp.so: start without that layer
    pyseccomp = None
if "--path" in sys.argv:
    sys.path.pop()

# Modules a cell may import. They, and what they import lazily, are loaded now: after the filter
# no file can be opened. This list gives readable errors; it is not the boundary (seccomp is).
ALLOWED = (
    "math json re random itertools functools collections heapq bisect statistics string textwrap "
    "datetime time typing dataclasses copy operator asyncio fractions decimal"
).split()
# Imported lazily by allowed modules, some through the cell's own __import__ (strptime -> _strptime).
INTERNAL = ["_strptime", "unicodedata", "encodings"]
for _name in ALLOWED + INTERNAL + ["encodings.latin_1", "encodings.ascii", "encodings.idna"]:
    __import__(_name)
time.localtime()  # reads /etc/localtime once, while files can still be opened

# --- framing: identical copy of rao_core/agent/sandbox/protocol.py (this script runs standalone) ---
MAX_FRAME = 16 * 2**20
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    pass


def encode(msg: dict) -> bytes:
    body = json.dumps(msg, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME} byte limit")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: feed() bytes as they arrive, get back the complete frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        frames = []
        while len(self._buf) >= 4:
            (n,) = _HEADER.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise ProtocolError(f"oversized frame ({n} bytes)")
            if len(self._buf) < 4 + n:
                break
            body = bytes(self._buf[4 : 4 + n])
            del self._buf[: 4 + n]
            try:
                msg = json.loads(body)
            except (ValueError, RecursionError) as e:
                raise ProtocolError(f"malformed frame ({type(e).__name__})") from None
            if not isinstance(msg, dict):
                raise ProtocolError("malformed frame (not an object)")
            frames.append(msg)
        return frames


# --- end of the framing copy ---


class Channel:
    """Blocking frame I/O on fd 0/1; EOF on fd 0 means the orchestrator is gone, so we exit."""

    def __init__(self, rfd: int = 0, wfd: int = 1) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.decoder = FrameDecoder()
        self.queue: list[dict] = []

    def send(self, msg: dict) -> None:
        data = memoryview(encode(msg))
        while data:
            data = data[os.write(self.wfd, data) :]

    def pump(self) -> None:
        """One read (blocks only if nothing is buffered in the pipe); queues the complete frames."""
        chunk = os.read(self.rfd, 1 << 20)
        if not chunk:
            os._exit(0)
        self.queue += self.decoder.feed(chunk)

    def recv(self) -> dict:
        while not self.queue:
            self.pump()
        return self.queue.pop(0)


class Capture(io.TextIOBase):
    """stdout/stderr of a cell: keeps the first `limit` characters and drops the rest (never buffers a
    200 MiB print)."""

    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.left = limit
        self.truncated = False

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        if len(s) > self.left:
            self.truncated = True
        if self.left > 0 and s:
            self.parts.append(s[: self.left])
            self.left -= len(self.parts[-1])
        return len(s)

    def writable(self) -> bool:
        return True

    def text(self) -> str:
        return "".join(self.parts) + ("\n[output truncated]\n" if self.truncated else "")


class WorkerLoop(asyncio.SelectorEventLoop):
    """The worker's only event loop, made before the filter (its self-pipe is a socketpair, which the
    filter forbids). close() is a no-op so `asyncio.run(main())` in a cell can reuse it."""

    def close(self) -> None:
        pass


class Repl:
    def __init__(self, chan: Channel, init: dict) -> None:
        self.chan = chan
        self.loop = WorkerLoop()
        policy = asyncio.DefaultEventLoopPolicy()
        policy.new_event_loop = lambda: self.loop  # type: ignore[method-assign]
        asyncio.set_event_loop_policy(policy)
        self.loop.add_reader(chan.rfd, self._on_readable)  # serves replies while the loop runs
        self.limit = int(init["limits"]["max_output_chars"])
        self.echo = bool(init.get("echo"))  # print a trailing expression's value, as notebooks do
        self.cells = 0
        self.next_id = 0
        self.futures: dict[int, asyncio.Future] = {}
        self.replies: dict[int, dict] = {}
        self.coros: list[tuple[str, Any]] = []
        safe = dict(vars(builtins), __import__=_guarded_import, open=_no_open)
        for name in ("help", "license", "credits", "copyright", "breakpoint"):
            safe.pop(name, None)
        self.ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": safe, "asyncio": asyncio}
        self.ns.update(init.get("variables") or {})
        for name in init["sync_tools"]:
            self.ns[name] = self._sync_tool(name)
        for name in init["async_tools"]:
            self.ns[name] = self._async_tool(name)

    # --- tool calls -------------------------------------------------------------------------
    def _send_call(self, name: str, args: tuple, kwargs: dict) -> int:
        self.next_id += 1
        msg = {"type": "call", "id": self.next_id, "name": name, "args": args, "kwargs": kwargs}
        try:
            self.chan.send(msg)
        except (TypeError, ValueError, ProtocolError) as e:  # ValueError: NaN, cycles, bad unicode
            raise TypeError(
                f"{name}(): arguments must be JSON values (str, int, float, bool, None, list, dict): {e}"
            ) from None
        return self.next_id

    def _dispatch(self) -> None:
        """Route queued replies: to the waiting future (async call) or to self.replies (sync call)."""
        for msg in self.chan.queue:
            fut = self.futures.pop(msg.get("id"), None)  # type: ignore[arg-type]
            if fut is not None and not fut.done():
                fut.set_result(msg)
            elif fut is None and msg.get("type") == "result":
                self.replies[msg["id"]] = msg
        self.chan.queue.clear()

    def _on_readable(self) -> None:
        self.chan.pump()
        self._dispatch()

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        cid = self._send_call(name, args, kwargs)
        self._dispatch()
        while cid not in self.replies:  # blocking; replies to pending async calls are routed meanwhile
            self.chan.pump()
            self._dispatch()
        return _unwrap(self.replies.pop(cid))

    async def acall(self, name: str, args: tuple, kwargs: dict) -> Any:
        cid = self._send_call(name, args, kwargs)
        fut = self.futures[cid] = self.loop.create_future()
        try:
            return _unwrap(await fut)
        finally:
            self.futures.pop(cid, None)

    def _sync_tool(self, name: str) -> Any:
        def tool(*args: Any, **kwargs: Any) -> Any:
            return self.call(name, args, kwargs)

        tool.__name__ = tool.__qualname__ = name
        return tool

    def _async_tool(self, name: str) -> Any:
        async def run(*args: Any, **kwargs: Any) -> Any:
            return await self.acall(name, args, kwargs)

        def tool(*args: Any, **kwargs: Any) -> Any:
            coro = run(*args, **kwargs)
            self.coros.append((name, coro))  # checked after the cell: never awaited -> warning
            return coro

        tool.__name__ = tool.__qualname__ = name
        tool._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
        return tool

    # --- cells --------------------------------------------------------------------------------
    def run(self, source: str) -> str:
        self.cells += 1
        filename = f"<cell-{self.cells}>"
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        try:
            tree = compile(source, filename, "exec", flags=flags | ast.PyCF_ONLY_AST, dont_inherit=True)
            if self.echo and tree.body and isinstance(tree.body[-1], ast.Expr):
                last = tree.body[-1]
                target = ast.Name("_echo_", ast.Store())
                tree.body[-1] = ast.copy_location(ast.Assign([target], last.value), last)
                ast.fix_missing_locations(tree)
            code = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
        except (SyntaxError, ValueError) as e:  # nothing runs
            return format_exception(e)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        out = Capture(self.limit)
        sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = out
        asyncio.set_event_loop(self.loop)
        tail = []
        try:
            self.ns.pop("_echo_", None)
            result = eval(code, self.ns)
            if inspect.iscoroutine(result):
                self.loop.run_until_complete(result)
            value = self.ns.pop("_echo_", None)
            if value is not None:
                print(value if isinstance(value, str) else repr(value))
        except BaseException as e:  # SystemExit included: the cell's exception is part of its output
            tail.append(format_exception(e))
        finally:
            tail += self._after_cell()
            sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = Capture(0)
        return out.text() + "".join(tail)

    def _after_cell(self) -> list[str]:
        notes = []
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        if tasks:
            for t in tasks:
                t.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            notes.append(
                f"Warning: {len(tasks)} task(s) still running at the end of the cell were cancelled.\n"
            )
        unawaited = Counter()
        for name, coro in self.coros:
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                unawaited[name] += 1
                coro.close()
        self.coros.clear()
        self.replies.clear()  # late replies to cancelled async calls
        for name, k in unawaited.items():
            times = "" if k == 1 else f" {k} times"
            notes.append(f"Warning: {name}(...) was called{times} without await; it did not run.\n")
        return notes


def _unwrap(msg: dict) -> Any:
    if msg.get("ok"):
        return msg.get("value")
    raise RuntimeError(str(msg.get("error")))


def _guarded_import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> Any:
    top = name.partition(".")[0]
    if level or (top not in ALLOWED and top not in INTERNAL):
        raise ImportError(f"import of {top or name!r} is not allowed in this sandbox")
    if name not in sys.modules:
        raise ImportError(f"module {name!r} is not available in this sandbox")
    for attr in fromlist or ():
        if attr != "*" and not hasattr(sys.modules[name], attr) and f"{name}.{attr}" not in sys.modules:
            raise ImportError(f"cannot import name {attr!r} from {name!r} in this sandbox")
    return __import__(name, globals, locals, fromlist, level)


def _no_open(*args: Any, **kwargs: Any) -> Any:
    raise PermissionError("open() is not allowed in this sandbox")


def format_exception(e: BaseException, max_chars: int = 20_000) -> str:
    """A short traceback: only the cell's frames, shown as "<cell>" with their source lines."""
    frames = [
        traceback.FrameSummary(
            "<cell>", lineno, f.f_code.co_name, line=linecache.getline(f.f_code.co_filename, lineno)
        )
        for f, lineno in traceback.walk_tb(e.__traceback__)
        if f.f_code.co_filename.startswith("<cell-")
    ]
    if isinstance(e, SyntaxError) and (e.filename or "").startswith("<cell-"):
        e.filename = "<cell>"
    text = "".join(traceback.format_exception_only(type(e), e))
    if frames:
        lines = traceback.StackSummary.from_list(frames).format()  # folds a recursion into 3 lines
        if len(lines) > 40:
            lines = lines[:10] + ["  ...\n"] + lines[-30:]
        text = "Traceback (most recent call last):\n" + "".join(lines) + text
    return text if len(text) <= max_chars else text[:max_chars] + "...\n"


# --- the boundary -------------------------------------------------------------------------------
# A deny-list, each rule answering EPERM. Grouped by what it stops; see docs/sandbox.md.
DENY = """
open openat openat2 creat open_by_handle_at name_to_handle_at mknod mknodat uselib
unlink unlinkat rename renameat renameat2 mkdir mkdirat rmdir link linkat symlink symlinkat
chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat truncate ftruncate utime utimes utimensat
futimesat setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr
execve execveat fork vfork clone ptrace process_vm_readv process_vm_writev process_madvise kcmp
pidfd_open pidfd_getfd pidfd_send_signal process_mrelease get_robust_list setsid setpgid prctl
socket socketpair connect bind listen accept accept4
setpriority sched_setscheduler sched_setparam sched_setattr sched_setaffinity ioprio_set
move_pages migrate_pages mlock mlock2 mlockall
shmget shmat shmctl shmdt semget semop semtimedop semctl msgget msgsnd msgrcv msgctl
mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr
fanotify_init fanotify_mark inotify_init inotify_init1 inotify_add_watch
mount umount2 unshare setns chroot pivot_root move_mount open_tree fsopen fsconfig fsmount fspick mount_setattr
bpf io_uring_setup io_uring_enter io_uring_register perf_event_open setrlimit prlimit64 personality
userfaultfd memfd_create memfd_secret keyctl add_key request_key init_module finit_module delete_module
kexec_load kexec_file_load reboot syslog acct swapon swapoff settimeofday clock_settime clock_adjtime
adjtimex sethostname setdomainname iopl ioperm quotactl quotactl_fd vhangup lookup_dcookie
""".split()
SIGNALS = "kill tkill tgkill rt_sigqueueinfo rt_tgsigqueueinfo".split()  # allowed only at our own pid
# Setting an fd's owner makes the kernel signal that owner on I/O (F_SETSIG picks the signal, even
# SIGKILL): a cell could kill any process of its uid that way, the orchestrator included.
OWNER_CMDS = [("fcntl", 8), ("fcntl", 15), ("fcntl", 10), ("ioctl", 0x8901), ("ioctl", 0x8902)]
# F_SETOWN, F_SETOWN_EX, F_SETSIG, FIOSETOWN, SIOCSPGRP


def install_seccomp() -> None:
    sc, pid = pyseccomp, os.getpid()
    rules = [(n, errno.EPERM, ()) for n in DENY]
    rules += [("clone3", errno.ENOSYS, ())]  # ENOSYS, not EPERM: glibc then falls back to clone (denied)
    rules += [(n, errno.EPERM, (sc.Arg(0, sc.NE, pid),)) for n in SIGNALS]
    # the kernel reads cmd as 32 bits: compare only those, or high bits would slip past the filter
    rules += [(n, errno.EPERM, (sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, cmd),)) for n, cmd in OWNER_CMDS]
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    for name, err, args in rules:
        nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
        if nr >= 0:  # negative: not a syscall on this architecture
            f.add_rule(sc.ERRNO(err), nr, *args)
    f.load()


def apply_limits(limits: dict) -> list[str]:
    """rlimits, then (if asked and available) the seccomp filter. Returns the active layers."""
    mem = int(limits["memory_mb"]) * 2**20
    cpu = int(limits["cpu_seconds"])
    top_fd = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    for res, value in [
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the limit, SIGKILL a second later
        (resource.RLIMIT_FSIZE, (0, 0)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NOFILE, (top_fd + 9, top_fd + 9)),
        (resource.RLIMIT_NPROC, (0, 0)),  # no effect for root; seccomp is what stops fork there
    ]:
        resource.setrlimit(res, value)
    layers = ["process", "rlimits"]
    if limits.get("seccomp", True) and pyseccomp is not None:
        install_seccomp()  # an error here fails the start: asked-for seccomp that cannot load is not skipped
        layers.append("seccomp")
    return layers


def detach(ppid: int | None) -> None:
    """Die with the orchestrator, keep none of its fds or environment, sit in /."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if ppid is not None and os.getppid() != ppid:  # parent died before prctl took effect
        os._exit(0)
    os.closerange(3, 1 << 16)
    os.environ.clear()
    os.chdir("/")


def serve(chan: Channel) -> None:
    init = chan.recv()
    repl = Repl(chan, init)
    try:
        layers = apply_limits(init["limits"])
    except Exception as e:
        chan.send({"type": "ready", "layers": [], "error": f"{type(e).__name__}: {e}"})
        os._exit(1)
    sys.stdin = sys.__stdin__ = io.StringIO()  # input() gets EOF instead of eating protocol bytes
    sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = Capture(0)
    chan.send({"type": "ready", "layers": layers, "pid": os.getpid()})
    while True:
        msg = chan.recv()
        if msg.get("type") == "cell":
            out = repl.run(str(msg.get("code", "")))
            out = out.encode("utf-8", "replace").decode()  # lone surrogates cannot cross as UTF-8
            try:
                chan.send({"type": "done", "output": out})
            except ProtocolError:
                chan.send({"type": "done", "output": out[: MAX_FRAME // 8] + "\n[output truncated]\n"})
        elif msg.get("type") == "exit":
            os._exit(0)
        # anything else between cells is a late reply to a cancelled call: ignore it


def zygote(ctl: socket.socket) -> None:
    """Fork server: for each 4-byte request id, fork a worker whose fd 0/1 is one end of a new
    socketpair, and send back the id and the child's pid with the other end and a pidfd attached
    (SCM_RIGHTS). Everything is already imported, so a worker is ready in a few milliseconds."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps our children
    zpid = os.getpid()
    while True:
        req = ctl.recv(4)
        if len(req) != 4:
            os._exit(0)
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.setsid()
                fd = theirs.detach()
                ours.detach(), ctl.detach()  # detach() below closes their fds
                os.dup2(fd, 0)
                os.dup2(fd, 1)
                detach(zpid)
                serve(Channel(0, 1))
            finally:
                os._exit(1)
        theirs.close()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # the child is already gone: answer "no worker"
            socket.send_fds(ctl, [req + struct.pack(">i", 0)], [])
        else:
            socket.send_fds(ctl, [req + struct.pack(">i", pid)], [ours.fileno(), pidfd])
            os.close(pidfd)
        ours.close()


def main() -> None:
    ppid = int(sys.argv[sys.argv.index("--ppid") + 1]) if "--ppid" in sys.argv else None
    if "--zygote" in sys.argv:
        ctl = socket.socket(fileno=0)
        detach(ppid)
        zygote(ctl)
    detach(ppid)
    serve(Channel(0, 1))


if __name__ == "__main__":
    main()
