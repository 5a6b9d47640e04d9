"""A scripted expert for the small TextCraft profile: one short action per cell, recursive or flat.

It is an oracle on the environment's state, but every action is a real cell run by the runtime, so
its trees are exactly what a model would produce:

  recursive: info(goal) -> sub(x) for each missing ingredient -> craft(goal) -> finish('done')
  flat:      the same walk as a stack in one context: info before each craft, crafts in post-order

With `error_rate` > 0 it slips the way the tiny model does (a misspelt name in a lookup or a craft,
a forgotten ingredient, a craft too early), at most once per item, then repairs from the error it
reads, so the data shows recovery. Slip turns are remembered in `mistakes` (node id -> turn
indices) so the warm start can keep them out of the loss while still training on the repair.

With `root_inline_rate` > 0 that share of recursive trees have a root that walks the whole task
inline instead of delegating (sub-agents still delegate): a warm start trained on such data rarely
delegates at the root, the starting point for RL to teach it to.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rao_core.agent.parsing import get_format
from rao_core.envs.textcraft.small import SmallEnv
from rao_core.policy import Generation, GenerationRequest, NodeState, Policy

FORMAT = get_format("python")  # terse: a thought buys a tiny model nothing


@dataclass
class _Frame:
    """One item being made in this context: look it up, get what is missing, craft it."""

    item: str
    todo: list[str] = field(default_factory=list)
    looked_up: bool = False
    craft_from: int | None = None  # the item's count when craft(item) was sent
    slipped: bool = False  # at most one slip per item: only a give-up sub-agent loops


class SmallExpert(Policy):
    def __init__(
        self,
        error_rate: float = 0.0,
        latency_s: float = 0.0,
        give_up_rate: float = 0.0,
        root_inline_rate: float = 0.0,
    ) -> None:
        self.error_rate, self.latency_s, self.give_up_rate = error_rate, latency_s, give_up_rate
        self.root_inline_rate = root_inline_rate  # share of recursive roots that walk the task inline
        self.mistakes: dict[str, set[int]] = {}

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        code, slip = self.next_cell(request.node)
        if slip:
            self.mistakes.setdefault(request.node.node_id, set()).add(request.node.turn)
        return Generation(text=FORMAT.wrap("", code))

    def _slip(self, node: NodeState, frame: _Frame) -> bool:
        if frame.slipped or self.error_rate <= 0 or node.rng.random() >= self.error_rate:
            return False
        frame.slipped = True
        return True

    def next_cell(self, node: NodeState) -> tuple[str, bool]:
        """(cell, whether it is a deliberate mistake)."""
        env: SmallEnv = node.env  # type: ignore[assignment]
        if (
            node.depth > 0
            and node.turn == 0
            and self.give_up_rate > 0
            and node.rng.random() < self.give_up_rate
        ):
            # A sub-agent that fails, the two ways the model's sub-agents fail: it quits at once, or it
            # repeats a misspelt cell until the loop guard stops it. Its parent must recover.
            typo = _typo(env.target, env, node)
            node.memory["loop_cell"] = f"craft({typo!r})" if typo and node.rng.random() < 0.5 else None
            if node.memory["loop_cell"] is None:
                return "finish('done')", True
        if node.memory.get("loop_cell"):
            return node.memory["loop_cell"], True
        if node.depth == 0 and node.recursive and self.root_inline_rate > 0 and "inline" not in node.memory:
            node.memory["inline"] = node.rng.random() < self.root_inline_rate  # no draw at 0: same data
        stack: list[_Frame] = node.memory.setdefault("stack", [_Frame(env.target)])
        if not stack:
            return "finish('done')", False
        top = stack[-1]
        if top.craft_from is not None:  # last turn crafted top.item: did it work?
            if env.inventory.get(top.item) > top.craft_from:
                stack.pop()
                return self.next_cell(node)
            top.todo, top.craft_from = env.missing(top.item), None  # repair: fetch what was missing
        if not top.looked_up:
            typo = _typo(top.item, env, node)
            if typo and self._slip(node, top):  # a misspelt lookup ("unknown item"), then the right one
                return f"info({typo!r})", True
            top.looked_up, top.todo = True, env.missing(top.item)
            if top.todo and self._slip(node, top):
                top.todo = top.todo[1:]  # forgets one ingredient: the craft will say what is missing
            return f"info({top.item!r})", False
        if top.todo:
            if self._slip(node, top):  # crafts too early: the error names the missing ingredients
                return self._craft(top, env)
            item = top.todo.pop(0)
            if node.recursive and node.depth < node.max_depth and not node.memory.get("inline"):
                return f"sub({item!r})", False
            stack.append(_Frame(item))
            return self.next_cell(node)
        typo = _typo(top.item, env, node)
        if typo and self._slip(node, top):  # the name copied back from far up the context, wrong
            return f"craft({typo!r})", True
        return self._craft(top, env)

    @staticmethod
    def _craft(top: _Frame, env: SmallEnv) -> tuple[str, bool]:
        """A craft is a mistake exactly when an ingredient is still missing."""
        top.craft_from = env.inventory.get(top.item)
        return f"craft({top.item!r})", bool(env.missing(top.item))


def _typo(name: str, env: SmallEnv, node: NodeState) -> str | None:
    """A plausible misspelling that names no item of this world (a copy slip: a wrong letter, a
    dropped or doubled digit). Drawn before the slip is decided, so the rng stream stays aligned."""
    letter = node.rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz" if c != name[0]])
    options = [letter + name[1:], name[:-1], name + name[-1]]
    options = [t for t in options if t not in env.world.tiers and len(t) >= 2 and t[1:].isdigit()]
    return node.rng.choice(options) if options else None
