"""The transformers engine in child processes (`policy.engine_processes`, one per core by default).

Why: one HFEngine keeps one core busy (its forwards, sampling and K/V bookkeeping run in one
thread), and on the 2-core machine the other core idled: the trees' event loop needs only 2-3 s of
CPU a round. Replicas in child processes, a node's turns all on one, use every core; they
exchange only token ids with the parent over pipes (docs/engines.md has the measurements).

    parent (the trees' event loop)                 child (spawned once per EngineScope and role)
    ProcessEngine.generate(request) --("gen", id, ids, ...)--> HFEngine.generate (continuous batching)
                                   <--(id, True, Generation)--

One child serves one model at a time: `load` swaps in a checkpoint (a new HFEngine, so no K/V of
the old weights survives) and costs a model load (0.28 s for the tiny model), not a process start
(6.5 s here). The child lives as long as the EngineScope that started it (a campaign: every round
and evaluation), or, outside any scope, as long as its ProcessEngine. Sampling is seeded per request as in process,
so a round's tokens are the same either way (tests/engines/test_hf_process.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import gc
import itertools
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rao_core.policy import Generation, GenerationRequest, Policy


@dataclass(frozen=True)
class EngineSpec:
    """What the child loads: a checkpoint, the tokenizer that frames it, and HFEngine's settings."""

    model: str
    tokenizer: Any  # a Hugging Face tokenizer (pickled to the child)
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 64
    max_batch_tokens: int = 65536
    decode: str = "auto"
    cuda_graphs: bool = True
    context_limit: int | None = None
    sampler: str = "auto"
    cpu_threads: int = 1


# A child that loads a checkpoint for longer than this is stuck (a model the size of the machine
# loads in minutes): the stage fails with a line instead of waiting forever.
LOAD_TIMEOUT_S = 1800.0


class EngineProcess:
    """A child process running HFEngine, and the thread here that routes its answers to callers."""

    def __init__(self) -> None:
        # A fresh interpreter (`python -m` this module) rather than multiprocessing's spawn, which
        # re-runs the parent's main script, and fork, which copies a process holding torch threads.
        down_r, down_w = os.pipe()  # parent -> child
        up_r, up_w = os.pipe()  # child -> parent
        root = str(Path(__file__).resolve().parents[2])  # where rao_core is, installed or not
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rao_core.engines.hf_process", str(down_r), str(up_w)],
            pass_fds=(down_r, up_w),
            env={**os.environ, "PYTHONPATH": path},
        )
        os.close(down_r)
        os.close(up_w)
        self._to_child = Connection(down_w, readable=False)
        self._from_child = Connection(up_r, writable=False)
        self._lock = threading.Lock()  # sends, and the waiting table against the child's exit
        self._gone: Exception | None = None  # set once the child has exited
        self._waiting: dict[int, concurrent.futures.Future] = {}
        self._ids = itertools.count()
        self.device = "cpu"  # where the loaded model is (the child says at each load)
        threading.Thread(target=self._route, name="rao-hf-engine-replies", daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def call(self, kind: str, *payload: Any) -> concurrent.futures.Future:
        """Send one message; its answer resolves the returned future."""
        i, fut = next(self._ids), concurrent.futures.Future()
        with self._lock:
            if self._gone is not None:
                fut.set_exception(self._gone)
                return fut
            self._waiting[i] = fut
            try:
                self._to_child.send((kind, i, *payload))
            except (OSError, ValueError) as e:  # the pipe is closed: the child is going
                self._waiting.pop(i, None)
                fut.set_exception(RuntimeError(f"hf engine process is gone ({e})"))
        return fut

    def cancel(self, fut: concurrent.futures.Future) -> None:
        for i, f in list(self._waiting.items()):
            if f is fut:
                self.call("cancel", i)

    def load(self, spec: EngineSpec) -> concurrent.futures.Future:
        """Serve `spec` from now on: a fresh HFEngine (weights read again, no K/V kept). Resolves
        once loaded (the child may still be starting: several children load in parallel)."""
        return self.call("load", spec)  # its result: the device the model is on

    def stats(self) -> Any:
        """The current HFEngine's EngineStats."""
        return self.call("stats").result()

    def stop(self) -> None:
        self.ask_to_stop()
        self.wait_stopped()

    def ask_to_stop(self) -> None:
        """Tell the child to stop (it cancels its requests and exits); `wait_stopped` waits for it.
        Apart, so that a scope stops all its children at once."""
        if self.alive():
            self.call("stop")

    def wait_stopped(self, timeout: float = 10.0) -> None:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._to_child.close()

    def _route(self) -> None:
        while True:
            try:
                i, ok, value = self._from_child.recv()
            except (EOFError, OSError):
                break
            fut = self._waiting.pop(i, None)
            if fut is None or not fut.set_running_or_notify_cancel():
                continue  # a cancelled request's late answer
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(RuntimeError(f"hf engine process: {value}"))
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._from_child.close()
        with self._lock:
            self._gone = RuntimeError(f"hf engine process exited (code {code})")
            for fut in self._waiting.values():
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(self._gone)
            self._waiting.clear()


class ProcessEngine(Policy):
    """The Policy the runtime sees: requests go to an EngineProcess that has loaded `spec`."""

    def __init__(self, spec: EngineSpec, process: EngineProcess, owned: bool) -> None:
        """`owned`: `close` stops the process (an engine outside any EngineScope)."""
        self.spec, self.process, self.owned = spec, process, owned

    @property
    def stats(self) -> Any:
        return self.process.stats()

    async def generate(self, request: GenerationRequest) -> Generation:
        r = request
        fut = self.process.call("gen", r.prompt_ids, r.max_new_tokens, r.stop, r.temperature, r.seed)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self.process.cancel(fut)
            raise

    async def close(self) -> None:
        """Stop the child if this engine owns it; else unload the model, so an idle child (while
        the trainer runs) gives its K/V and batch memory back."""
        if self.owned:
            await asyncio.to_thread(self.process.stop)
        elif self.process.alive():
            try:
                await asyncio.wrap_future(self.process.call("unload"))
            except RuntimeError:  # the child died meanwhile: nothing to free
                pass


class ReplicatedEngine(Policy):
    """One Policy over N engines serving the same model (each a child process, so each a core): a
    node's first request goes to the least busy replica and its later turns follow it there, where
    the K/V of its conversation are. Sampling is seeded per request, so which replica serves a
    node does not change its tokens."""

    def __init__(self, replicas: list[Policy]) -> None:
        self.replicas = replicas
        self.busy = [0] * len(replicas)  # requests in flight per replica
        self.home: dict[str, int] = {}  # node id -> its replica

    async def generate(self, request: GenerationRequest) -> Generation:
        node = request.node.node_id if request.node is not None else None
        k = self.home.get(node) if node is not None else None
        if k is None:
            k = min(range(len(self.replicas)), key=self.busy.__getitem__)
            if node is not None:
                self.home[node] = k
        self.busy[k] += 1
        try:
            return await self.replicas[k].generate(request)
        finally:
            self.busy[k] -= 1

    async def close(self) -> None:
        for r in self.replicas:
            await r.close()


def start_processes(policy_cfg, role: str = "policy") -> None:
    """Start the current scope's children for an hf `policy_cfg` now (their imports take seconds)
    without waiting for them; the first engine built in the scope then finds them ready."""
    from rao_core.engines import engine_processes
    from rao_core.engines.scope import current_scope

    scope = current_scope()
    for k in range(engine_processes(policy_cfg) if scope is not None else 0):
        key = (role, policy_cfg.device, policy_cfg.dtype, k)
        if key not in scope.hf_processes:
            scope.hf_processes[key] = EngineProcess()


def process_engine(spec: EngineSpec, role: str = "policy", processes: int = 1) -> Policy:
    """`processes` engines serving `spec`, each in a child: the current EngineScope's children for
    `role` (started on first use, restarted if one died), or children of their own outside any
    scope (stopped by `close`)."""
    from rao_core.engines.scope import current_scope

    scope = current_scope()
    procs = []
    for k in range(processes):
        key = (role, spec.device, spec.dtype, k)
        proc = scope.hf_processes.get(key) if scope is not None else None
        if proc is None or not proc.alive():
            proc = EngineProcess()
            if scope is not None:
                scope.hf_processes[key] = proc
        procs.append(proc)
    for p, load in [(p, p.load(spec)) for p in procs]:
        try:
            p.device = load.result(timeout=LOAD_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            raise RuntimeError(
                f"hf engine process: loading {spec.model} took over {LOAD_TIMEOUT_S:g} s; giving up"
            ) from None
    engines = [ProcessEngine(spec, p, owned=scope is None) for p in procs]
    return engines[0] if processes == 1 else ReplicatedEngine(engines)


# ---- the child -----------------------------------------------------------------------------------


async def _serve(inbox_conn: Connection, conn: Connection) -> None:
    """Read messages on a thread, answer each on this loop; exit on 'stop' or when the parent goes."""
    from rao_core.engines.hf import HFEngine

    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                msg = inbox_conn.recv()
            except (EOFError, OSError):
                msg = ("stop", -1)
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
            if msg[0] == "stop":
                return

    threading.Thread(target=read, daemon=True).start()
    engine: HFEngine | None = None
    running: dict[int, asyncio.Task] = {}
    cancelled: set[int] = set()  # by the parent: no answer expected

    async def answer(i: int, ids, max_new, stop, temperature, seed) -> None:
        req = GenerationRequest(list(ids), max_new, tuple(stop), None, temperature, seed)
        try:
            if engine is None:
                raise RuntimeError("no model loaded (the last load failed)")
            reply = (i, True, await engine.generate(req))
        except asyncio.CancelledError:
            if i in cancelled:  # the parent gave up on it: it expects no answer
                cancelled.discard(i)
                running.pop(i, None)
                return
            reply = (i, False, "the engine was reloaded while this request ran")
        except Exception as e:
            reply = (i, False, f"{type(e).__name__}: {e}")
        running.pop(i, None)
        conn.send(reply)

    while True:
        kind, i, *payload = await inbox.get()
        if kind == "gen":
            running[i] = loop.create_task(answer(i, *payload))
        elif kind == "cancel":
            task = running.get(payload[0])
            if task is not None:
                cancelled.add(payload[0])
                task.cancel()
        elif kind == "unload":
            engine = await _unload(engine)
            conn.send((i, True, None))
        elif kind == "load":
            spec: EngineSpec = payload[0]
            try:
                engine = await _unload(engine)
                engine = HFEngine.from_pretrained(
                    Path(spec.model), spec.tokenizer, device=spec.device, dtype=spec.dtype,
                    max_batch_size=spec.max_batch_size, max_batch_tokens=spec.max_batch_tokens,
                    decode=spec.decode, cuda_graphs=spec.cuda_graphs, context_limit=spec.context_limit,
                    sampler=spec.sampler, cpu_threads=spec.cpu_threads,
                )  # fmt: skip
                conn.send((i, True, engine.device.type))
            except Exception as e:
                engine = None
                conn.send((i, False, f"loading {spec.model}: {type(e).__name__}: {e}"))
        elif kind == "stats":
            conn.send((i, engine is not None, engine.stats if engine else "no model loaded"))
        elif kind == "stop":
            break
    for task in running.values():
        task.cancel()
    if engine is not None:
        await engine.close()


async def _unload(engine) -> None:
    """Close an engine and hand its memory back to the OS (glibc keeps freed blocks otherwise)."""
    if engine is not None:
        await engine.close()
        del engine
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    return None


if __name__ == "__main__":  # the child: python -m rao_core.engines.hf_process READ_FD WRITE_FD
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    read_fd, write_fd = map(int, sys.argv[1:3])
    asyncio.run(_serve(Connection(read_fd, writable=False), Connection(write_fd, readable=False)))
