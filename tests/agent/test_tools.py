"""Tools can wait: an async tool is awaited and a plain one runs in a worker thread, so a tool that
blocks delays only its own node; forks that share state still take turns.

No timing assertions: the blocking tools wait on a gate that opens only once the other trees have
ended. Run on the event loop, they would block those trees, the gate would time out, and the tool
would report it."""

from __future__ import annotations

import asyncio
import threading
import time

from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.base import Environment
from tests.agent.test_runtime import CHAT, fan_out
from tests.conftest import CellScript

AGENT = AgentConfig(
    cell_timeout_s=60.0, tree_timeout_s=120.0, reply_format="thought_python", max_context_tokens=8192
)
GATE_S = 30.0


class GateEnv(Environment):
    """Tools: `blocking()` waits in its thread for `thread_gate`, `waiting()` awaits `loop_gate`,
    `fast()` returns at once. `counter` is shared by a tree's forks; `bump()` is a read-modify-write
    that would lose updates if two ran at once."""

    suite = "gate"

    def __init__(
        self, goal: str, gates: dict, counter: list[int] | None = None, shared: bool = False
    ) -> None:
        self.goal, self.gates, self.counter, self.shared_state = goal, gates, counter or [0], shared

    def goal_text(self) -> str:
        return self.goal

    def targets(self) -> dict:
        return {}

    def blocking(self) -> str:
        return "opened" if self.gates["thread"].wait(GATE_S) else "gate timed out"

    async def waiting(self) -> str:
        try:
            await asyncio.wait_for(self.gates["loop"].wait(), GATE_S)
            return "opened"
        except TimeoutError:
            return "gate timed out"

    def bump(self) -> int:
        value = self.counter[0]
        time.sleep(0.2)  # a thread switch here loses an update unless calls take turns
        self.counter[0] = value + 1
        return self.counter[0]

    def tools(self):
        return {"blocking": self.blocking, "waiting": self.waiting, "fast": lambda: 1, "bump": self.bump}

    def tool_docs(self, recursive: bool) -> str:
        return "blocking(), waiting(), fast(), bump()"

    def fork(self, goal=None, context=None) -> GateEnv:
        return GateEnv(str(goal), self.gates, self.counter, self.shared_state)

    def success(self, finished: bool, finish_message: str) -> float:
        return float(finished and finish_message == "opened")


def test_a_waiting_tool_delays_only_its_own_node():
    async def main():
        gates = {"thread": threading.Event(), "loop": asyncio.Event()}
        quick = [TreeSpec(f"quick{i}", 0, GateEnv("fast", gates)) for i in range(4)]
        slow = [
            TreeSpec("blocking", 0, GateEnv("blocking", gates)),
            TreeSpec("waiting", 0, GateEnv("waiting", gates)),
        ]
        ended: list[str] = []

        def done(run) -> None:
            ended.append(run.spec.task_id)
            if len([t for t in ended if t.startswith("quick")]) == len(quick):
                gates["thread"].set()
                gates["loop"].set()

        def script(node):
            name = node.env.goal
            return f"r = {name}()\nprint(r)" if node.turn == 0 else f"finish(str({name}()))"

        runs = await run_trees(slow + quick, CellScript(script), CHAT, AGENT, SandboxConfig(tool_threads=2),
                               concurrency=8, on_tree_done=done)  # fmt: skip
        return runs, ended

    runs, ended = asyncio.run(main())
    by_id = {run.spec.task_id: run for run in runs}
    for name in ("blocking", "waiting"):
        root = by_id[name].records[0]
        assert root.finish_message == "opened", root.transcript  # the others ended while it waited
        assert ended.index(name) >= 4
    assert all(by_id[f"quick{i}"].records[0].status == "finished" for i in range(4))


def test_forks_that_share_state_take_turns():
    """Six concurrent children bump one shared counter in threads: with shared_state they take
    turns and no update is lost; without it, the same calls race (the control)."""

    def run(shared: bool) -> int:
        env = GateEnv("root", {"thread": threading.Event(), "loop": None}, shared=shared)
        asyncio.run(
            run_trees([TreeSpec("t", 0, env)], CellScript(fan_out(6, "finish(str(bump()))")), CHAT, AGENT,
                      SandboxConfig(tool_threads=6))
        )  # fmt: skip
        return env.counter[0]

    assert run(shared=True) == 6
    assert run(shared=False) < 6  # the control: threads really do run the plain tools at once
