"""The sandboxed REPL: cell semantics, tool calls, limits, and a matrix of hostile cells.

Every hostile cell runs next to a healthy sandbox in the same event loop; the healthy one must keep
working, and the test process (the orchestrator) must survive. Async tests use asyncio.run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rao_core.agent.sandbox import Sandbox, client, processes, set_start_method, shutdown_sandboxes
from rao_core.agent.sandbox.protocol import MAX_FRAME, FrameDecoder, ProtocolError, encode
from rao_core.config import SandboxConfig

LIMITS = SandboxConfig(memory_mb=512, cpu_seconds=30, max_output_chars=10_000)
# os without `import os`: a class defined in os.py hands out its module's globals
OS = "os = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0].__init__.__globals__['sys'].modules['os']\n"
# raw syscalls through ctypes, reached via a tool function's globals (the worker imports ctypes)
LIBC = "C = get.__globals__['ctypes']\nlibc = C.CDLL(None, use_errno=True)\nlibc.syscall.restype = C.c_long\nL = C.c_long\n"


class Tools:
    """A handler that records its calls: get/fail are sync tools, slow is async."""

    def __init__(self, delay: float = 0.2) -> None:
        self.calls: list[tuple[str, list, dict]] = []
        self.delay = delay

    async def __call__(self, name: str, args: list, kwargs: dict):
        self.calls.append((name, args, kwargs))
        if name == "fail":
            raise KeyError("no recipe for 'stone axe'")
        if name == "slow":
            await asyncio.sleep(self.delay)
        if name == "bad":
            return {1, 2}
        return {"name": name, "args": args, "kwargs": kwargs}


async def start(limits: SandboxConfig = LIMITS, variables: dict | None = None) -> Sandbox:
    return await Sandbox.start(["get", "fail", "bad"], ["slow"], limits, variables)


async def cells(codes: list[str], timeout: float = 10.0, **kw) -> list:
    sb, tools = await start(**kw), Tools()
    try:
        return [await sb.run_cell(c, tools, timeout=timeout) for c in codes]
    finally:
        await sb.close()


def our_workers() -> list[int]:
    """Worker and zygote processes started by this test process (zygote children keep its argv)."""
    mine, pids = f"--ppid\0{os.getpid()}\0", []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_text()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if processes.WORKER in cmd and mine in cmd and state != "Z":
            pids.append(int(pid))
    return pids


@pytest.fixture(autouse=True, scope="module")
def no_leftover_processes():
    yield
    set_start_method("zygote")
    asyncio.run(shutdown_sandboxes())
    deadline = time.monotonic() + 3  # zygote children die by PDEATHSIG, asynchronously
    while our_workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert our_workers() == []


@pytest.fixture(params=["zygote", "exec"])
def method(request):
    set_start_method(request.param)
    yield request.param
    set_start_method("zygote")


def test_frame_decoder():
    data = encode({"a": 1}) + encode({"b": ["é", 2]})
    decoder = FrameDecoder()
    assert [f for i in range(len(data)) for f in decoder.feed(data[i : i + 1])] == [{"a": 1}, {"b": ["é", 2]}]
    for bad in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x01[", b"\x00\x00\x00\x02[]", b"\x00\x00\x00\x02\xff}"):
        with pytest.raises(ProtocolError):
            FrameDecoder().feed(bad)
    with pytest.raises(ProtocolError):
        encode({"x": "y" * MAX_FRAME})


def test_worker_framing_is_a_copy_of_protocol():
    """worker.py runs standalone, so it carries its own copy of the framing code: keep it identical."""
    proto = Path(client.__file__).with_name("protocol.py").read_text()
    worker = Path(processes.WORKER).read_text()
    copy = worker[worker.index("MAX_FRAME = ") : worker.index("# --- end of the framing copy")]
    assert copy.strip() == proto[proto.index("MAX_FRAME = ") :].strip()


# --- cell semantics ---------------------------------------------------------------------------
def test_variables_persist_and_layers(method):
    async def main():
        sb = await start(variables={"context": "abc" * 2_000_000, "n": 3})
        assert sb.layers == ["process", "rlimits", "seccomp"] and sb.alive
        r1 = await sb.run_cell("x = n * 2\nlen(context)", Tools(), 5)
        r2 = await sb.run_cell("print(x, len(context), context[:3])", Tools(), 5)
        await sb.close()
        await sb.close()  # idempotent
        r3 = await sb.run_cell("print(1)", Tools(), 5)
        return r1, r2, r3, sb.alive

    r1, r2, r3, alive = asyncio.run(main())
    assert (r1.status, r1.output) == ("ok", "")  # a last expression is not echoed
    assert (r2.status, r2.output) == ("ok", "6 6000000 abc\n")
    assert r3.status == "crashed" and not alive


class AllInFlight(Tools):
    """`slow` returns only once all three calls are in flight at the same time (else it fails)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight, self.all_in = 0, asyncio.Event()

    async def __call__(self, name: str, args: list, kwargs: dict):
        self.in_flight += 1
        if self.in_flight == 3:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), timeout=5.0)  # sequential calls never get here
        return await super().__call__(name, args, kwargs)


def test_gather_of_async_tools_is_concurrent(method):
    async def main():
        sb = await start()
        try:
            return await sb.run_cell(
                "r = await asyncio.gather(slow(1), slow(2), slow(b=3))\nprint(r[2]['kwargs'])",
                AllInFlight(),
                10,
            )
        finally:
            await sb.close()

    r = asyncio.run(main())
    assert r.status == "ok" and r.output == "{'b': 3}\n", r.output


def test_sync_tools_and_handler_errors():
    r = asyncio.run(
        cells(
            [
                "print(get(1, (2, 3), k='v'))",
                "try:\n    fail('stone axe')\nexcept RuntimeError as e:\n    print('caught', e)",
                "fail('x')",
                "get({1, 2})",
                "bad()",
                "t = asyncio.ensure_future(slow(1))\nawait asyncio.sleep(0.05)\nprint(get(2)['args'], (await t)['args'])",
                "asyncio.run(asyncio.sleep(0.01))\nprint('ran')",
            ]
        )
    )
    assert r[0].output == "{'name': 'get', 'args': [1, [2, 3]], 'kwargs': {'k': 'v'}}\n"
    assert r[1].output == "caught \"no recipe for 'stone axe'\"\n"
    assert r[2].output.startswith(
        'Traceback (most recent call last):\n  File "<cell>", line 1, in <module>\n    fail('
    )
    assert (
        r[2].output.endswith("RuntimeError: \"no recipe for 'stone axe'\"\n")
        and "client.py" not in r[2].output
    )
    assert "TypeError: get(): arguments must be JSON values" in r[3].output and "set" in r[3].output
    assert "RuntimeError: tool bad returned a non-JSON value" in r[4].output
    assert r[5].output == "[2] [1]\n"  # a sync call while an async one is pending
    assert r[6].output == "ran\n"
    assert all(x.status == "ok" for x in r)


def test_call_limit():
    async def main():
        sb, tools = await start(), Tools(delay=0)
        code = "for i in range(5):\n    try:\n        get(i)\n    except RuntimeError as e:\n        print(e)"
        r = await sb.run_cell(code, tools, 5, max_calls=3)
        runaway = await sb.run_cell(
            "for i in range(500):\n    try: get(i)\n    except RuntimeError: pass", tools, 5, max_calls=3
        )
        await sb.close()
        return r, runaway, tools.calls

    r, runaway, calls = asyncio.run(main())
    assert r.output == "call limit of 3 per cell reached\n" * 2
    assert runaway.status == "crashed" and "runaway" in runaway.error
    assert len(calls) == 6  # 3 per cell: the rejected ones never reach the handler


def test_unawaited_coroutines_syntax_errors_and_imports():
    r = asyncio.run(
        cells(
            [
                "slow(1)\nslow(2)\nget(0)",
                "asyncio.ensure_future(slow(3))",
                "print('never runs')\nx = (",
                "import os",
                "from json import tool",
                "import math, collections.abc\nprint(math.gcd(12, 18))",
            ]
        )
    )
    assert r[0].output == "Warning: slow(...) was called 2 times without await; it did not run.\n"
    assert r[1].output == "Warning: 1 task(s) still running at the end of the cell were cancelled.\n"
    assert "never runs" not in r[2].output and "SyntaxError: '(' was never closed" in r[2].output
    assert 'File "<cell>", line 2' in r[2].output
    assert "ImportError: import of 'os' is not allowed in this sandbox" in r[3].output
    assert "ImportError: cannot import name 'tool'" in r[4].output
    assert r[5].output == "6\n"
    assert all(x.status == "ok" for x in r)


def test_output_cap():
    r = asyncio.run(
        cells(
            [
                "print('y' * (200 * 2**20))\nprint('after')",
                "len.__self__.__import__('sys').stderr.write('e' * 20000)",
            ]
        )
    )
    assert r[0].status == "ok" and len(r[0].output) < LIMITS.max_output_chars + 100
    assert r[0].output.endswith("[output truncated]\n") and "after" not in r[0].output
    assert r[1].output == "e" * LIMITS.max_output_chars + "\n[output truncated]\n"


def test_timeout_counts_the_cell_not_its_tool_calls():
    async def main():
        sb, tools = await start(), Tools(delay=0.6)
        ok = await sb.run_cell("await slow(1)\nprint('done')", tools, timeout=0.4)
        strict = await sb.run_cell("await slow(1)", tools, timeout=0.4, include_call_time=True)
        await sb.close()
        return ok, strict

    ok, strict = asyncio.run(main())
    assert (ok.status, ok.output) == ("ok", "done\n")
    assert strict.status == "timeout"


def test_no_seccomp_layer_is_reported(monkeypatch, caplog):
    set_start_method("exec")
    monkeypatch.setattr(client, "_logged_layers", False)
    argv = processes._worker_argv
    monkeypatch.setattr(processes, "_worker_argv", lambda *extra: argv(*extra)[:6])  # no --path: no pyseccomp
    try:
        with caplog.at_level(logging.WARNING):
            r = asyncio.run(cells(["print(len.__self__.open('/etc/passwd').read().startswith('root:'))"]))
    finally:
        set_start_method("zygote")
    assert r[0].output == "True\n"  # without seccomp a cell can read files: the docs say so
    assert "WITHOUT seccomp" in caplog.text


# --- hostile cells ------------------------------------------------------------------------------
def _tmp(tmp_path: Path) -> str:
    return str(tmp_path / "pwned")


HOSTILE = {
    "infinite_loop": ("while True:\n    pass", "timeout", None),
    "memory_bomb": ("s = 'x' * (8 * 2**30)", "ok", "MemoryError"),
    "fork_bomb_subclasses": (OS + "while True:\n    os.fork()", "ok", "PermissionError"),
    "fork_via_builtins": ("len.__self__.__import__('os').fork()", "ok", "PermissionError"),
    "thread": (
        "len.__self__.__import__('threading').Thread(target=print).start()",
        "ok",
        "can't start new thread",
    ),
    "import_os": ("import os", "ok", "ImportError: import of 'os' is not allowed in this sandbox"),
    "read_passwd": ("print(open('/etc/passwd').read())", "ok", "PermissionError"),
    "read_passwd_real_open": (
        "print(len.__self__.open('/etc/passwd').read())",
        "ok",
        "Operation not permitted",
    ),
    "write_file": ("len.__self__.open(TMP, 'w').write('x')", "ok", "Operation not permitted"),
    "os_system": (OS + "print(os.system('touch ' + TMP))", "ok", None),
    "subprocess": (
        "len.__self__.__import__('subprocess').run(['touch', TMP])",
        "ok",
        "Operation not permitted",
    ),
    "ctypes_system": ("get.__globals__['ctypes'].CDLL(None).system(('touch ' + TMP).encode())", "ok", None),
    "socket": (
        "s = len.__self__.__import__('socket').socket()\ns.connect(('127.0.0.1', PORT))",
        "ok",
        "PermissionError",
    ),
    "deep_recursion": ("def f(n):\n    return f(n + 1)\nf(0)", "ok", "RecursionError"),
    "system_exit": ("raise SystemExit(3)", "ok", "SystemExit: 3"),
    "os_exit": (OS + "os._exit(3)", "crashed", None),
    "kill_parent": (OS + "os.kill(os.getppid(), 9)", "ok", "PermissionError"),
    "kill_orchestrator": (OS + "os.kill(ORCHESTRATOR, 9)", "ok", "PermissionError"),
    "kill_group": (OS + "os.killpg(os.getpgid(ORCHESTRATOR), 9)", "ok", "PermissionError"),
    "kill_self": (OS + "os.kill(os.getpid(), 9)", "crashed", None),
    "forged_frame": (
        OS + "os.write(1, b'\\xff\\xff\\xff\\xf0' + b'{' * 100)\nwhile True: pass",
        "crashed",
        None,
    ),
    "forged_call": (OS + "os.write(1, b'\\x00\\x00\\x00\\x02[]')\nwhile True: pass", "crashed", None),
    "setrlimit": (
        "r = get.__globals__['resource']\nr.setrlimit(r.RLIMIT_CPU, (10**6, 10**6))",
        "ok",
        "ValueError",
    ),
    # F_SETOWN + F_SETSIG(SIGKILL) + O_ASYNC on a pipe: the kernel would SIGKILL the owner on I/O
    "sigio_owner": (
        OS
        + LIBC
        + "r, w = os.pipe()\nfor cmd in (8, 8 + (1 << 32)):\n    print(libc.syscall(L(72), L(r), L(cmd), L(VICTIM)))\n"
        "libc.fcntl(r, 10, 9)\nlibc.fcntl(r, 4, 0o20000)\nos.write(w, b'x')",
        "ok",
        "-1\n-1\n",
    ),
    "raw_kill_high_bits": (LIBC + "print(libc.syscall(L(62), L(VICTIM + (1 << 32)), L(9)))", "ok", "-1\n"),
    "sysv_shm": (LIBC + "print(libc.shmget(0, 4096, 0o1600), C.get_errno())", "ok", "-1 1\n"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_cell_is_contained(name, tmp_path, method):
    code, want_status, want_text = HOSTILE[name]
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    victim = subprocess.Popen(["sleep", "30"])  # a bystander process of the same uid
    variables = {"TMP": _tmp(tmp_path), "PORT": listener.getsockname()[1], "ORCHESTRATOR": os.getpid()}
    variables["VICTIM"] = victim.pid

    async def main():
        healthy, bad, tools = await start(), await start(variables=variables), Tools(delay=0.05)
        await healthy.run_cell("n = 41", tools, 5)
        hostile = bad.run_cell(code, tools, timeout=1.5)
        bystander = healthy.run_cell("await asyncio.sleep(0.1)\nn += 1\nprint(n, get('x')['name'])", tools, 5)
        r, b = await asyncio.gather(hostile, bystander)
        after_bad = await bad.run_cell("print('still here')", tools, 5)
        after = await healthy.run_cell("print(n, (await slow(1))['name'])", tools, 5)
        fresh = await start()  # the zygote survived too
        again = await fresh.run_cell("print('fresh')", tools, 5)
        bad_alive = bad.alive
        for sb in (healthy, bad, fresh):
            await sb.close()
        return r, b, after_bad, after, again, bad_alive

    r, b, after_bad, after, again, bad_alive = asyncio.run(main())
    listener_hit = _accepted(listener)
    time.sleep(0.05)
    victim_died = victim.poll() is not None
    victim.kill(), victim.wait()
    assert not victim_died
    assert r.status == want_status, (r, name)
    if want_text:
        assert want_text in r.output, r.output
    if r.status == "ok":  # the worker survived its own cell and goes on
        assert after_bad.output == "still here\n" and bad_alive
    else:
        assert r.error and after_bad.status == "crashed" and not bad_alive  # crashed: not hung to the timeout
    assert (b.output, after.output, again.output) == ("42 get\n", "42 slow\n", "fresh\n")
    assert not os.path.exists(_tmp(tmp_path)) and not listener_hit


def _accepted(listener: socket.socket) -> bool:
    try:
        listener.accept()[0].close()
        return True
    except BlockingIOError:
        return False
    finally:
        listener.close()


def test_zygote_workers_differ_and_zygote_restarts():
    async def main():
        a, b = await start(), await start()
        ra = await a.run_cell("import random\nprint(random.random())", Tools(), 5)
        rb = await b.run_cell("import random\nprint(random.random())", Tools(), 5)
        processes._zygote.popen.kill()  # its workers die with it (PDEATHSIG); the next start makes a new one
        await asyncio.sleep(0.2)
        dead = await a.run_cell("print(1)", Tools(), 5)
        c = await start()
        rc = await c.run_cell("print('new')", Tools(), 5)
        for sb in (a, b, c):
            await sb.close()
        return ra, rb, dead, rc

    ra, rb, dead, rc = asyncio.run(main())
    assert ra.output != rb.output  # random is reseeded after fork
    assert dead.status == "crashed" and dead.error.startswith("REPL worker died")
    assert rc.output == "new\n"


def test_exit_code_and_signal_in_crash_message():
    set_start_method("exec")
    try:
        (r,) = asyncio.run(cells([OS + "os.kill(os.getpid(), 9)"]))
    finally:
        set_start_method("zygote")
    assert (r.status, r.error) == ("crashed", "REPL worker died (exit code -9, SIGKILL)")


def test_echo_prints_trailing_expression():
    async def main():
        sb = await Sandbox.start(["t"], [], SandboxConfig(), echo=True)
        try:

            async def handler(name, args, kwargs):
                return f"got {args[0]}"

            out = [
                (await sb.run_cell(code, handler, 5.0)).output for code in ("t('a')", "x = 1\nx + 1", "None")
            ]
        finally:
            await sb.close()
        return out

    assert asyncio.run(main()) == ["got a\n", "2\n", ""]
