"""A dataset's demonstrator: the warm start of Route A without token ids (docs/own-task.md).

    warmstart:
      demonstrator: mytasks.demo:solve     # def solve(task: dict) -> list[str]: the cells a node writes

The function gets a node's task as a dict (a root: its row, `id`, `goal`, `answer`, `targets`,
`difficulty`, `split`, `context`; a sub-agent: the `goal` and `context` its parent launched it with,
`id` and `answer` None), plus `depth` and `recursive` (False in the warm start's flat trees, where
there is no launch_subagent). It returns the cells the node writes, in order: each a string of
Python, or a (thought, code) pair for agent.reply_format=thought_python; the last calls finish().
A root's cells may launch sub-agents; each sub-agent's cells come from the same function. None (or
no cells) gives up on that task. The warm start runs these trees in the sandbox with the run's
tokenizer and chat framing, and learns from the nodes that succeed (rao_core/train/warmstart.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rao_core.agent.parsing import get_format
from rao_core.policy import Generation, GenerationRequest, NodeState, Policy

GIVE_UP = "finish('')"  # the cell after the last one (a demonstration that never finished)


def task_of(node: NodeState) -> dict[str, Any]:
    """What the demonstrator sees of a node: its row (a root) or its launch (a sub-agent)."""
    env = node.env
    task = env.task.as_dict() if getattr(env, "task", None) is not None else {
        "id": None, "goal": env.goal, "answer": None, "targets": {}, "context": env.context,
    }  # fmt: skip
    return {**task, "depth": node.depth, "recursive": node.recursive}


def as_cells(out: Any, name: str) -> list[tuple[str, str]]:
    """The function's return value as (thought, code) cells; TypeError in one line otherwise."""
    if out is None:
        return []
    if isinstance(out, str):
        out = [out]
    cells = []
    for cell in out if isinstance(out, list | tuple) else [None]:
        if isinstance(cell, str):
            cells.append(("", cell))
        elif isinstance(cell, tuple) and len(cell) == 2 and all(isinstance(x, str) for x in cell):
            cells.append(cell)
        else:
            raise TypeError(
                f"warmstart.demonstrator {name} returned {out!r}: expected a list of cells, each a string "
                "of Python or a (thought, code) pair"
            )
    return cells


class CellsDemonstrator(Policy):
    """Writes the cells the user's function gives for each node, one per turn, in the reply format."""

    def __init__(self, fn: Callable[[dict], Any], name: str, reply_format: str) -> None:
        self.fn, self.name, self.fmt = fn, name, get_format(reply_format)

    async def generate(self, request: GenerationRequest) -> Generation:
        node = request.node
        if "cells" not in node.memory:
            out = self.fn(task_of(node))
            out = await out if inspect.isawaitable(out) else out
            node.memory["cells"] = as_cells(out, self.name)
        cells = node.memory["cells"]
        thought, code = cells[node.turn] if node.turn < len(cells) else ("", GIVE_UP)
        return Generation(text=self.fmt.wrap(thought, code))
