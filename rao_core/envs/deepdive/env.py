"""The DeepDive environment: a question, the two search tools, and sub-agents with free-text goals.

Success (s(X) of the RAO method):
- root, synthetic question: exact match after normalisation (answers.py) against the walk's end,
  an exact verifier, so judge_inputs is None;
- root, real question: the same exact match as a fallback, and judge_inputs for a judge against
  the ground truth (the reference scores DeepDive roots with an LLM judge);
- sub-agent: no exact verifier, so judge_inputs hands a judge {goal, answer, reference?}. The
  reference is computed when the goal reads back as a hop phrase of the graph ("Find the founder of
  Kelvar Press", nested or starting from the root's description; see questions.Resolver). Fallback
  success() when no judge is wired: 1 if a reference exists and the (short) answer names it as
  whole words, else 0, so a sub-agent whose goal the environment cannot read earns nothing
  without a judge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rao_core.envs.base import Environment, LaunchError
from rao_core.envs.deepdive.answers import exact_match, mentions
from rao_core.envs.deepdive.graph import Graph
from rao_core.envs.deepdive.questions import Chain, Resolver, Task
from rao_core.envs.deepdive.tools import WebTools

MAX_GOAL_CHARS = 2000
MAX_CHILD_ANSWER_CHARS = 300  # a longer sub-agent answer is not checked by containment

TOOL_DOCS = """\
Tools (call them in your Python cell):
- search_web(query: str, max_results: int = 5) -> list[dict]: a web search; ranked results, each
  {{"title": ..., "url": ..., "snippet": ...}}.
- view_webpage_content(url: str, start: int = 0) -> str: the text of a page, {page_chars} characters
  at a time; a cut page ends with the call that reads on.
- finish(message): end this node; the message is your answer.
"""

RECURSIVE_DOCS = """\
- await launch_subagent(goal: str, context: str = "") -> str: a sub-agent with a fresh context
  researches `goal` (it sees nothing else: name the entity it starts from) and returns its finish
  message. A hop that needs the previous hop's answer must wait for it.
"""

EXAMPLE = """\
Questions chain facts: identify the entity described, follow each relation in turn, and answer with
the exact name only. Example cell:
for r in search_web("cartographer born 1952 Tarquel Prize"):
    print(r["title"], r["url"], r["snippet"])
"""


class DeepDiveWorld:
    """What every node of every tree shares: the graph (None for real questions) and the tools."""

    def __init__(self, graph: Graph | None, tools: WebTools) -> None:
        self.graph, self.tools = graph, tools


class DeepDiveEnv(Environment):
    suite = "deepdive"

    def __init__(
        self,
        world: DeepDiveWorld,
        goal: str,
        *,
        answer: str | None = None,
        chain: Chain | None = None,
        descriptions: dict[str, str] | None = None,
        context: str = "",
    ) -> None:
        """A root has `answer` (and `chain` for synthetic questions); a sub-agent has neither, and
        its chain and reference are read back from its goal."""
        self.world, self.goal, self.context = world, goal, context
        self.is_root = answer is not None
        self.descriptions = dict(descriptions or {})  # inherited by sub-agents
        resolver = Resolver(world.graph, self.descriptions) if world.graph is not None else None
        if chain is None and resolver is not None and not self.is_root:
            chain = resolver.of_goal(goal)
        self.chain = chain
        self.reference = answer if self.is_root else (resolver.answer(chain) if chain and resolver else None)

    # --- Environment interface -------------------------------------------------------------
    def goal_text(self) -> str:
        return f"{self.goal}\nContext: {self.context}" if self.context else self.goal

    def targets(self) -> dict[str, Any]:
        hops = len(self.chain.relations) if self.chain else None
        return {"goal": self.goal, "hops": hops, "reference": self.reference}

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {
            "search_web": self.world.tools.search_web,
            "view_webpage_content": self.world.tools.view_webpage_content,
        }

    def tool_docs(self, recursive: bool) -> str:
        docs = TOOL_DOCS.format(page_chars=self.world.tools.page_chars)
        return docs + (RECURSIVE_DOCS if recursive else "") + EXAMPLE

    def fork(self, goal: Any = None, context: Any = "") -> DeepDiveEnv:
        if not isinstance(goal, str) or not goal.strip():
            raise LaunchError("goal must be a non-empty string")
        if len(goal) > MAX_GOAL_CHARS:
            raise LaunchError(f"goal is {len(goal)} characters; at most {MAX_GOAL_CHARS}")
        if not isinstance(context, str):
            raise LaunchError("context must be a string")
        return DeepDiveEnv(self.world, goal.strip(), descriptions=self.descriptions, context=context)

    def success(self, finished: bool, finish_message: str) -> float:
        if not finished or self.reference is None:
            return 0.0
        if self.is_root:
            return float(exact_match(finish_message, self.reference))
        short = len(finish_message) <= MAX_CHILD_ANSWER_CHARS
        return float(short and mentions(finish_message, self.reference))

    def judge_inputs(self, finished: bool, finish_message: str) -> dict[str, str] | None:
        """None for synthetic roots (exact verifier) and for unfinished nodes (s = 0, nothing to
        judge); otherwise what a judge needs, the reference included when known."""
        if not finished or (self.is_root and self.chain is not None):
            return None
        out = {"goal": self.goal_text(), "answer": finish_message}
        if self.reference is not None:
            out["reference"] = self.reference
        return out


def env_from_task(world: DeepDiveWorld, task: Task) -> DeepDiveEnv:
    """A root environment for a task (synthetic: its walk is the chain; real: no chain)."""
    if task.source == "real" or not task.path:
        return DeepDiveEnv(world, task.question, answer=task.answer)
    chain = Chain(task.path[0], list(task.relations), task.description)
    return DeepDiveEnv(
        world, task.question, answer=task.answer, chain=chain, descriptions={task.description: task.path[0]}
    )
