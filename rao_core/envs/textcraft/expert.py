"""A scripted expert for TextCraft-Synth that writes real cells, recursive or flat.

It knows the world's recipes (it is an oracle), but every action goes through the REPL and the real
tools, so its trees exercise the runtime exactly as a model's would. Each turn it looks at the shared
inventory and decides the next cell:

  recursive: inspect targets -> delegate missing craftable ingredients (concurrently) -> craft -> finish
  flat:      inspect targets -> one craft per cell along the solver's plan -> craft -> finish

With `error_rate` > 0 it makes plausible mistakes (wrong amounts, misspelt names, giving up early),
so its trees are not all perfect and failed nodes appear in the data.
"""

from __future__ import annotations

import math
import re

from rao_core.envs.expert import ScriptedExpert
from rao_core.envs.textcraft.env import TextCraftEnv
from rao_core.envs.textcraft.solver import solve
from rao_core.envs.textcraft.world import World
from rao_core.policy import NodeState

_CRAFTED = re.compile(r"^Crafted (\d+) (\S+?)\.", re.M)


def _craft_call(world: World, item: str, crafts: int, wrong: bool = False) -> str:
    recipe = world.items[item].recipe
    assert recipe is not None
    amounts = {ing: n * crafts for ing, n in recipe.ingredients.items()}
    if wrong:  # an off-by-one amount: the tool answers with an error, the expert retries
        first = next(iter(amounts))
        amounts[first] += 1
    return f"print(craft({amounts!r}, ({item!r}, {crafts * recipe.output})))"


class TextCraftExpert(ScriptedExpert):
    def __init__(
        self,
        world: World,
        error_rate: float = 0.0,
        latency_s: float = 0.0,
        parallel: bool = True,
        inspect: bool = True,
        reply_format: str = "thought_python",
    ) -> None:
        super().__init__(error_rate, latency_s, reply_format)
        self.world, self.parallel, self.inspect = world, parallel, inspect

    # -- decisions -------------------------------------------------------------------------

    def _remaining(self, node: NodeState) -> dict[str, int]:
        """Target copies still to craft, counted from this node's own successful craft calls.

        Not from the inventory: siblings share it, so a copy a sibling made is not ours to count.
        """
        made = node.memory.setdefault("made", {})
        for count, item in _CRAFTED.findall(node.last_observation):
            made[item] = made.get(item, 0) + int(count)
        targets = node.env.targets().items()
        return {item: need - made.get(item, 0) for item, need in targets if made.get(item, 0) < need}

    def _shortfall(self, env: TextCraftEnv, remaining: dict[str, int]) -> dict[str, int]:
        """Ingredients missing for one batch of crafts of every remaining target."""
        needs: dict[str, int] = {}
        for item, count in remaining.items():
            recipe = self.world.items[item].recipe
            crafts = math.ceil(count / recipe.output)
            for ing, n in recipe.ingredients.items():
                needs[ing] = needs.get(ing, 0) + n * crafts
        return {ing: n - env.inventory.get(ing) for ing, n in needs.items() if env.inventory.get(ing) < n}

    def next_cell(self, node: NodeState) -> tuple[str, str]:
        env: TextCraftEnv = node.env  # type: ignore[assignment]
        mem = node.memory
        remaining = self._remaining(node)
        if self.inspect and not mem.get("inspected"):
            mem["inspected"] = True
            names = list(env.targets())
            if self._mistake(node):
                names = [n + "x" for n in names]  # a misspelt lookup: harmless, costs a turn
            return "Look up the recipes of my targets.", f"info = get_info({names!r})\nprint(info)"
        if not remaining:
            return "All targets are crafted.", f"finish({self._summary(env)!r})"
        if self.error_rate > 0 and node.rng.random() < self.error_rate / 4:
            return "I think this is enough.", "finish('Done.')"  # gives up early: a failed node
        missing = self._shortfall(env, remaining)
        craftable = {i: n for i, n in missing.items() if not self.world.is_base(i)}
        if any(self.world.is_base(i) for i in missing):
            lacking = sorted(i for i in missing if self.world.is_base(i))
            return "A base material is missing.", f"finish('Cannot craft: missing base {', '.join(lacking)}')"
        can_delegate = node.recursive and node.depth < node.max_depth
        if craftable and can_delegate and not mem.get("delegated"):
            mem["delegated"] = True
            return self._delegate(craftable)
        if craftable:  # flat: the next step of the solver's plan for what is missing
            plan = solve(self.world, env.inventory.snapshot(), craftable) or []
            if plan:
                item, crafts = plan[0]
                wrong = self._mistake(node)
                return f"Craft {item}.", _craft_call(self.world, item, crafts, wrong)
            return "No plan found.", "finish('Cannot craft the ingredients.')"
        lines = []
        for item, count in remaining.items():
            crafts = math.ceil(count / self.world.items[item].recipe.output)
            lines.append(_craft_call(self.world, item, crafts, self._mistake(node)))
        return "Craft the targets.", "\n".join(lines)

    def _delegate(self, craftable: dict[str, int]) -> tuple[str, str]:
        calls = [f"launch_subagent({{{item!r}: {n}}})" for item, n in craftable.items()]
        if self.parallel:
            code = "results = await asyncio.gather(\n    " + ",\n    ".join(calls) + ",\n)\nprint(results)"
        else:
            code = "\n".join(f"print(await {c})" for c in calls)
        return "Delegate the missing ingredients to sub-agents.", code

    def _summary(self, env: TextCraftEnv) -> str:
        return "Crafted " + ", ".join(f"{n} {item}" for item, n in env.targets().items())
