"""The Oolong environment: a question about a transcript held in the REPL variable `context`.

The transcript never enters a prompt: the goal says how long it is, and the node reads it with
Python or hands slices of it to sub-agents with `launch_subagent(goal, context=chunk)`, whose own
`context` is that chunk. The root is scored exactly (scoring.score_answer against the gold
answer). A sub-agent has no exact verifier in general, so it asks for a judge (judge_inputs); when
its goal is one of the known sub-task templates the environment recomputes the exact answer on its
chunk and gives it to the judge as the reference. Until a judge is wired in, success() of a
sub-agent falls back to: templated goal -> score_partial against that reference; any other goal
-> 1 if it finished with a non-empty message (a format-only signal), else 0.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from rao_core.envs.base import Environment, LaunchError
from rao_core.envs.oolong.extract import parse_events, partial
from rao_core.envs.oolong.questions import match_subgoal
from rao_core.envs.oolong.scoring import score_answer, score_partial

MAX_GOAL_CHARS = 4000  # a goal is instructions; data goes in context=

TOOL_DOCS = """\
Your data is the string variable `context` in your REPL. It is NOT in this prompt: look at it with
Python (len(context), context[:1000], str methods, re, json, collections) and print only what you
need, since long output is cut.
- finish(message): end this node; the message is your answer. A question about the whole
  transcript is answered in \\boxed{...}: an integer, a name, or a comma-separated list.
"""

RECURSIVE_DOCS = """\
- await launch_subagent(goal: str, context: str) -> str: start a sub-agent with a fresh REPL whose
  `context` is the string you pass (for example one chunk of about 32,000 characters, cut at line
  breaks); returns its finish message. Ask for a structured partial result (JSON text) and
  aggregate the results yourself. Run chunks concurrently:
  `results = await asyncio.gather(*(launch_subagent(goal, context=c) for c in chunks))`
"""


class OolongEnv(Environment):
    suite = "oolong"

    def __init__(self, context: str, goal: str, answer: Any = None, kind: str = "", arg: str = "") -> None:
        """A root when `answer` is given (the gold), else a sub-agent whose goal is `goal`."""
        self.context, self.goal, self.answer = context, goal, answer
        self.kind, self.arg = kind, arg
        self.is_root = answer is not None
        self.sub = None if self.is_root else match_subgoal(goal)  # (sub, arg, session, day)

    @functools.cached_property
    def reference(self) -> Any:
        """The exact answer of a templated sub-task on this node's chunk (None otherwise)."""
        if self.sub is None:
            return None
        sub, arg, session, day = self.sub
        return partial(sub, arg, parse_events(self.context, session, day))

    # --- Environment interface -------------------------------------------------------------
    def goal_text(self) -> str:
        where = f"The data is in the Python variable `context` ({len(self.context):,} characters), not shown here."
        if self.is_root:
            return f"{self.goal}\n{where}\nAnswer with finish(...) holding \\boxed{{answer}}."
        return f"{self.goal}\n{where}"

    def targets(self) -> dict[str, Any]:
        if self.is_root:
            return {"kind": self.kind, "arg": self.arg, "question": self.goal}
        return {"goal": self.goal, "subtask": self.sub[0] if self.sub else ""}

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {}

    def tool_docs(self, recursive: bool) -> str:
        return TOOL_DOCS + (RECURSIVE_DOCS if recursive else "")

    def fork(self, goal: Any = None, context: Any = None) -> OolongEnv:
        if not isinstance(goal, str) or not goal.strip():
            raise LaunchError(
                "goal must be a non-empty string: what the sub-agent should find in its context"
            )
        if len(goal) > MAX_GOAL_CHARS:
            raise LaunchError(
                f"goal has {len(goal)} characters (at most {MAX_GOAL_CHARS}): pass data as context=, not in the goal"
            )
        if not isinstance(context, str) or not context:
            raise LaunchError("context must be a non-empty string: the slice of text the sub-agent works on")
        return OolongEnv(context, goal.strip())

    def success(self, finished: bool, finish_message: str) -> float:
        if not finished:
            return 0.0
        if self.is_root:
            return score_answer(finish_message, self.answer)
        if self.sub is not None:
            return score_partial(finish_message, self.reference)
        return float(bool(finish_message.strip()))

    def judge_inputs(self, finished: bool, finish_message: str) -> dict[str, str] | None:
        """Sub-agents that finished: goal, answer and, for a templated goal, the exact reference.
        Roots (exact scorer) and unfinished nodes (0 either way) need no judge."""
        if self.is_root or not finished:
            return None
        out = {"goal": self.goal, "answer": finish_message}
        if self.sub is not None:
            out["reference"] = json.dumps(self.reference)
        return out

    def context_chars(self) -> int:
        return len(self.context)

    def repl_variables(self) -> dict[str, Any]:
        return {"context": self.context}


def env_from_task(task: Any) -> OolongEnv:
    """A root environment for a task (tasks.Task)."""
    return OolongEnv(task.context, task.question, task.answer, task.kind, task.arg)
