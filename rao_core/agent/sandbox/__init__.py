"""Sandboxed Python REPL for model-written cells: one worker process per agent node, see docs/sandbox.md."""

from rao_core.agent.sandbox.client import CellResult, Sandbox, shutdown_sandboxes
from rao_core.agent.sandbox.processes import SandboxError, set_start_method

__all__ = ["CellResult", "Sandbox", "SandboxError", "set_start_method", "shutdown_sandboxes"]
