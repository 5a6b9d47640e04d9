"""The small interface every task suite implements.

The agent runtime knows nothing about crafting or search: it asks the environment which tools the
REPL exposes, how a child's environment is forked from its parent's, and whether a node succeeded.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any


class LaunchError(ValueError):
    """Bad arguments to launch_subagent; the message is returned to the calling cell as a string."""


class Environment(ABC):
    suite: str = "base"
    # The REPL name of the delegation primitive. Async (awaited, siblings can run concurrently) in
    # the reference profiles; a suite for tiny models may expose a short blocking call like `sub(x)`.
    launch_tool: str = "launch_subagent"
    launch_async: bool = True
    repl_echo: bool = False  # print a cell's trailing expression (short actions for tiny models)

    @abstractmethod
    def goal_text(self) -> str:
        """The task as the node sees it in its first user message."""

    @abstractmethod
    def targets(self) -> dict[str, Any]:
        """Structured targets (JSON-serialisable), stored with the node."""

    @abstractmethod
    def tools(self) -> dict[str, Callable[..., Any]]:
        """Synchronous tools callable from a cell with JSON arguments; they return JSON values."""

    @abstractmethod
    def tool_docs(self, recursive: bool) -> str:
        """The action-space text of the system prompt (tool signatures and rules)."""

    @abstractmethod
    def fork(self, *args: Any, **kwargs: Any) -> Environment:
        """A child's environment from the arguments of `launch_subagent`; raises LaunchError."""

    @abstractmethod
    def success(self, finished: bool, finish_message: str) -> float:
        """s(X) in [0, 1] for the node that owns this environment."""

    def judge_inputs(self, finished: bool, finish_message: str) -> dict[str, str] | None:
        """For a node with no exact verifier (a sub-agent in the Oolong or DeepDive suites): what a
        judge must see, {"goal": ..., "answer": ..., "reference": ... (optional)}. The runtime then
        takes s(X) from the judge's verdict (success_source "judge"). None (the default): success()
        is exact (success_source "verifier")."""
        return None

    def context_chars(self) -> int:
        """Size of any context data the node holds outside its prompt (Oolong's `context`)."""
        return 0

    def repl_variables(self) -> dict[str, Any]:
        """JSON values preset as variables in the node's REPL (for example `context`)."""
        return {}


def select_tasks(tasks: list, split: str, difficulties: list[str], n: int, seed: int) -> list:
    """A seeded sample of n tasks of one split and the given difficulties (all of them if n >= pool);
    any suite's tasks, each with `.split` and `.difficulty`."""
    pool = [t for t in tasks if t.split == split and t.difficulty in difficulties]
    if n >= len(pool):
        return pool
    return random.Random(seed).sample(pool, n)
