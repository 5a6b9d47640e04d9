"""The base of the built-in suites' scripted experts: the next cell from the node's state, a
plausible slip now and then, and the reply format around it (a plugin suite may subclass it, or
write its Policy directly: docs/own-task.md)."""

from __future__ import annotations

import asyncio
from abc import abstractmethod

from rao_core.agent.parsing import get_format
from rao_core.policy import Generation, GenerationRequest, NodeState, Policy


class ScriptedExpert(Policy):
    """A suite's scripted expert: decides the next cell from the node's state, optionally slips
    (error_rate) and waits (latency_s, for benchmarks), and wraps the cell in the reply format."""

    def __init__(self, error_rate: float = 0.0, latency_s: float = 0.0, reply_format: str = "thought_python"):
        self.error_rate, self.latency_s = error_rate, latency_s
        self.fmt = get_format(reply_format)

    @abstractmethod
    def next_cell(self, node: NodeState) -> tuple[str, str]:
        """(thought, code) of the node's next turn."""

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        thought, code = self.next_cell(request.node)
        return Generation(text=self.fmt.wrap(thought, code))

    def _mistake(self, node: NodeState, scale: float = 1.0) -> bool:
        return self.error_rate > 0 and node.rng.random() < self.error_rate * scale
