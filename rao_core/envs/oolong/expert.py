"""A scripted chunk-and-delegate expert for Oolong that writes real cells.

It never reads the transcript outside the REPL: every node first sends the helpers of extract.py
(a line parser and tallies, what a model would write by hand) and looks at `context`, then

  recursive root: split `context` at line breaks -> one sub-agent per chunk, all concurrently,
                  each asked a templated sub-task -> aggregate their JSON results -> \\boxed{answer}
  single root:    the same chunks, one per turn, tallied by itself -> aggregate -> \\boxed{answer}
  sub-agent:      parse its chunk -> finish with the JSON its goal asks for

With `error_rate` > 0 a node sometimes skims (tallies only the first half of its text), so some
answers are wrong and scores fall below 1. Real oolong-real questions are beyond it: it answers
\\boxed{unknown}.
"""

from __future__ import annotations

import ast
import functools
import inspect

from rao_core.envs.expert import ScriptedExpert
from rao_core.envs.oolong import extract
from rao_core.envs.oolong.env import OolongEnv
from rao_core.envs.oolong.extract import SUB_OF, chunk_size, split_chunks
from rao_core.policy import NodeState

CHILD = ("PATTERNS", "parse_events", "partial")
ROOT = ("SUBGOALS", "subgoal", "state_at", "chunk_size", "split_chunks", "loads", "combine", "boxed")
SINGLE = ("PATTERNS", "parse_events", "partial", "state_at", "chunk_size", "split_chunks", "combine", "boxed")


@functools.cache
def helpers(names: tuple[str, ...]) -> str:
    """The named definitions of extract.py, without docstrings: the source of a first cell."""
    keep: list[ast.stmt] = []
    for stmt in ast.parse(inspect.getsource(extract)).body:
        name = getattr(stmt, "name", None) or getattr(getattr(stmt, "targets", [None])[0], "id", None)
        if isinstance(stmt, ast.Import) or name in names:
            if isinstance(stmt, ast.FunctionDef) and ast.get_docstring(stmt) is not None:
                stmt.body = stmt.body[1:]
            keep.append(stmt)
    return ast.unparse(ast.Module(keep, []))


class OolongExpert(ScriptedExpert):
    def __init__(
        self,
        chunk_chars: int = 32000,
        max_children: int = 8,
        max_steps: int = 25,
        error_rate: float = 0.0,
        latency_s: float = 0.0,
        reply_format: str = "thought_python",
    ) -> None:
        super().__init__(error_rate, latency_s, reply_format)
        self.chunk_chars, self.max_children, self.max_steps = chunk_chars, max_children, max_steps

    def _text(self, node: NodeState, name: str) -> str:
        """The slice a tally reads: all of `name`, or its first half when the node skims."""
        skim = self._mistake(node)
        return f"{name}[: len({name}) // 2]" if skim else name

    def next_cell(self, node: NodeState) -> tuple[str, str]:
        env: OolongEnv = node.env  # type: ignore[assignment]
        mem = node.memory
        n_delegate = len(
            split_chunks(env.context, chunk_size(len(env.context), self.chunk_chars, self.max_children))
        )
        delegate = env.is_root and node.recursive and node.depth < node.max_depth and n_delegate > 1
        if not mem.get("inspected"):
            mem["inspected"] = True
            names = ROOT if delegate else SINGLE if env.is_root else CHILD
            code = f"{helpers(names)}\nprint(len(context))\nprint(context[:300])"
            return "Define a line parser and tallies, then look at my data.", code
        if not env.is_root:
            return self._child(node, env)
        if env.kind not in SUB_OF:
            return "I cannot answer this kind of question.", "finish(boxed(None))"
        sub, arg = SUB_OF[env.kind], env.arg
        finish = f"finish(boxed(combine({env.kind!r}, {arg!r}, parts)))"
        if delegate:
            if not mem.get("delegated"):
                mem["delegated"] = True
                return "Split the transcript and delegate each chunk, concurrently.", self._delegate(sub, arg)
            return "Aggregate the sub-agents' results.", f"parts = [loads(r) for r in results]\n{finish}"
        steps = self.max_steps - 3  # inspect, aggregate, and one turn to spare
        n = len(split_chunks(env.context, chunk_size(len(env.context), self.chunk_chars, steps)))
        i = mem.get("chunk", 0)
        if i >= n:
            return "Aggregate my tallies.", finish
        mem["chunk"] = i + 1
        text = self._text(node, "c")
        code = f"a, c = chunks[{i}]\nparts.append(partial({sub!r}, {arg!r}, parse_events({text}, *state_at(context[:a]))))"
        if i == 0:
            size = f"chunk_size(len(context), {self.chunk_chars}, {steps})"
            code = f"chunks = split_chunks(context, {size})\nparts = []\n{code}"
        return f"Tally chunk {i + 1} of {n} myself.", f"{code}\nprint(parts[-1])"

    def _delegate(self, sub: str, arg: str) -> str:
        return (
            f"chunks = split_chunks(context, chunk_size(len(context), {self.chunk_chars}, {self.max_children}))\n"
            f"goals = [subgoal({sub!r}, {arg!r}, *state_at(context[:a])) for a, c in chunks]\n"
            "results = await asyncio.gather(*(launch_subagent(g, context=c) for g, (a, c) in zip(goals, chunks)))\n"
            "print(len(results), 'results; first:', results[0][:200])"
        )

    def _child(self, node: NodeState, env: OolongEnv) -> tuple[str, str]:
        if env.sub is None:
            return "I do not know this sub-task.", "finish('{}')"
        sub, arg, session, day = env.sub
        text = self._text(node, "context")
        code = f"part = partial({sub!r}, {arg!r}, parse_events({text}, {session}, {day}))\nfinish(json.dumps(part))"
        return "Tally my chunk and report it as JSON.", code
