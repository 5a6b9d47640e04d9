"""Where a node's cells run. The node only needs the `Executor` protocol; the subprocess sandbox
(rao_core/agent/sandbox: a worker process behind rlimits and seccomp) is the implementation, and
`SandboxExecutors` starts one per node and ends, when its owner ends, whatever it started."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from rao_core.agent.sandbox import Sandbox
from rao_core.agent.sandbox.client import CellResult, Handler
from rao_core.agent.sandbox.processes import close_zygote
from rao_core.config import SandboxConfig
from rao_core.envs.base import Environment
from rao_core.errors import SandboxStartError, retrying

START_ATTEMPTS = 3


class Executor(Protocol):
    layers: list[str]

    async def run_cell(self, code: str, handler: Handler, timeout: float, max_calls: int) -> CellResult: ...

    async def close(self) -> None: ...


class SandboxExecutors:
    """Starts each node's REPL worker (retried; one that cannot start raises SandboxStartError, an
    infrastructure failure) and, at `close`, ends the workers still running and the zygote they were
    forked from. One per event loop that runs trees (a rollout, a warm start's data, a benchmark).
    It also runs the suite's tools that the cells call (`call_tool`)."""

    def __init__(self, limits: SandboxConfig) -> None:
        self.limits = limits
        self.started: list[Sandbox] = []
        self.tool_pool = ThreadPoolExecutor(limits.tool_threads, thread_name_prefix="rao-tool")

    async def call_tool(self, tool: Callable[..., Any], args: list, kwargs: dict) -> Any:
        """An `async def` tool is awaited here; a plain one runs in the bounded thread pool, so a
        tool that waits on I/O delays only the node that called it."""
        if is_async(tool):
            return await tool(*args, **kwargs)
        call = functools.partial(tool, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.tool_pool, call)

    async def start(self, env: Environment, recursive: bool) -> Executor:
        launch = [env.launch_tool] if recursive else []
        kwargs: dict[str, Any] = {
            "sync_tools": [*env.tools(), "finish", *([] if env.launch_async else launch)],
            "async_tools": launch if env.launch_async else [],
            "limits": self.limits,
            "variables": env.repl_variables(),
            "echo": env.repl_echo,
        }
        try:
            sandbox = await retrying(START_ATTEMPTS)(Sandbox.start, **kwargs)
        except Exception as e:
            raise SandboxStartError(f"{type(e).__name__}: {e}") from e
        self.started.append(sandbox)
        return sandbox

    async def close(self) -> None:
        for sandbox in self.started:
            await sandbox.close()  # a no-op for the ones their nodes closed
        self.started.clear()
        close_zygote()  # bound to this event loop: the next one forks a new one
        self.tool_pool.shutdown(wait=False, cancel_futures=True)


def is_async(fn: Callable[..., Any]) -> bool:
    """An `async def` function or method, or an object whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
