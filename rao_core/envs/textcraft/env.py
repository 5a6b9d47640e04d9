"""The TextCraft-Synth environment: crafting tools over an inventory shared by a whole agent tree.

Tools take JSON arguments from model-written cells, so they never raise on bad input: every mistake
comes back as a one-line "Error: ..." string the model can read and correct.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rao_core.envs.base import Environment, LaunchError
from rao_core.envs.textcraft.tasks import Task
from rao_core.envs.textcraft.world import World


class Inventory:
    """A mutable item counter; a parent and all its children hold the same object."""

    def __init__(self, counts: dict[str, int] | None = None):
        self._counts = {k: int(v) for k, v in (counts or {}).items() if v > 0}

    def get(self, name: str) -> int:
        return self._counts.get(name, 0)

    def add(self, name: str, n: int) -> None:
        self._counts[name] = self.get(name) + n

    def remove(self, name: str, n: int) -> None:
        have = self.get(name)
        if have < n:
            raise ValueError(f"not enough {name}: have {have}, need {n}")
        if have == n:
            del self._counts[name]
        else:
            self._counts[name] = have - n

    def snapshot(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self._counts.items()) if v > 0}


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def check_targets(world: World, targets: Any) -> dict[str, int]:
    """Validate launch targets {item: positive int}; raises LaunchError with a one-line reason."""
    if not isinstance(targets, dict) or not targets:
        raise LaunchError("targets must be a non-empty dict of item name -> positive int count")
    for name, n in targets.items():
        if not isinstance(name, str) or name not in world.items:
            raise LaunchError(f"unknown item {name!r} in targets")
        if world.is_base(name):
            raise LaunchError(f"{name} is a base material: it cannot be crafted, so it cannot be a target")
        if not _is_count(n):
            raise LaunchError(f"count of {name} must be a positive int, got {n!r}")
    return dict(targets)


TOOL_DOCS = """\
Tools (call them in your Python cell):
- craft(ingredients: dict, target: (item, count)) -> str: craft `count` of `item`. `count` must be a
  multiple of the recipe's output; `ingredients` must name exactly the recipe's ingredients, each
  amount = recipe amount * count / output. Base materials (depth 0) cannot be crafted.
- get_info(items: list) -> list[dict]: per item: is_base, in_inventory, crafting_depth, can_craft,
  recipe {"ingredients": {...}, "output": n} (None for base materials).
- view_inventory() -> dict: item -> count.
- finish(message): end this node; the message goes to whoever launched you.
"""

RECURSIVE_DOCS = """\
- await launch_subagent(targets: dict, context: str = "") -> str: start a sub-agent with a fresh
  context that shares your inventory and crafts `targets`; returns its finish message. Run
  independent ones concurrently: `await asyncio.gather(launch_subagent(...), launch_subagent(...))`.
"""

EXAMPLE = """\
Success: each target's count rose by the required amount since you started (owning is not enough).
Example cell:
info = get_info(["m0_i2_1"])[0]
r = info["recipe"]
print(craft({k: v * 2 for k, v in r["ingredients"].items()}, ("m0_i2_1", 2 * r["output"])))
"""


class TextCraftEnv(Environment):
    suite = "textcraft"
    shared_state = True  # one inventory per tree

    def __init__(self, world: World, inventory: Inventory, targets: dict[str, int], context: str = ""):
        self.world = world
        self.inventory = inventory
        self._targets = dict(targets)
        self.context = context
        self.start_counts = {name: inventory.get(name) for name in self._targets}

    # --- Environment interface -------------------------------------------------------------
    def goal_text(self) -> str:
        goal = "Craft " + ", ".join(f"{n} {name}" for name, n in self._targets.items()) + "."
        return f"{goal}\nContext: {self.context}" if self.context else goal

    def targets(self) -> dict[str, int]:
        return dict(self._targets)

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {"craft": self.craft, "get_info": self.get_info, "view_inventory": self.view_inventory}

    def tool_docs(self, recursive: bool) -> str:
        return TOOL_DOCS + (RECURSIVE_DOCS if recursive else "") + EXAMPLE

    def fork(self, targets: Any = None, context: Any = "") -> TextCraftEnv:
        if not isinstance(context, str):
            raise LaunchError("context must be a string")
        return TextCraftEnv(self.world, self.inventory, check_targets(self.world, targets), context)

    def success(self, finished: bool, finish_message: str) -> float:
        if not finished:
            return 0.0
        for name, n in self._targets.items():
            if self.inventory.get(name) - self.start_counts[name] < n:
                return 0.0
        return 1.0

    # --- tools -----------------------------------------------------------------------------
    def craft(self, ingredients: Any = None, target: Any = None) -> str:
        try:
            return self._craft(ingredients, target)
        except Exception as e:  # a tool must never raise into the cell
            return f"Error: malformed arguments ({type(e).__name__})."

    def _craft(self, ingredients: Any, target: Any) -> str:
        if not isinstance(target, list | tuple) or len(target) != 2 or not isinstance(target[0], str):
            return "Error: malformed arguments: target must be (item, count), e.g. ('m0_i2_1', 2)."
        name, count = target
        if not _is_count(count):
            return f"Error: malformed arguments: count must be a positive int, got {count!r}."
        if not isinstance(ingredients, dict) or not all(isinstance(k, str) for k in ingredients):
            return "Error: malformed arguments: ingredients must be a dict of item name -> amount."
        item = self.world.items.get(name)
        if item is None:
            return f"Error: unknown item {name!r}."
        if item.recipe is None:
            return f"Error: {name} is a base material and cannot be crafted."
        recipe = item.recipe
        if count % recipe.output:
            return f"Error: count {count} is not a multiple of output {recipe.output} of {name}."
        for ing in ingredients:
            if ing not in self.world.items:
                return f"Error: unknown item {ing!r} in ingredients."
        if set(ingredients) != set(recipe.ingredients):
            return f"Error: wrong ingredients for {name}: expected {sorted(recipe.ingredients)}, got {sorted(ingredients)}."
        crafts = count // recipe.output
        for ing, amount in recipe.ingredients.items():
            given = ingredients[ing]
            if given != amount * crafts or isinstance(given, bool):
                return (
                    f"Error: amount of {ing} must be {amount * crafts} for count {count} of {name} "
                    f"(recipe: {amount} {ing} per {recipe.output}), got {given!r}."
                )
        for ing, amount in recipe.ingredients.items():
            have, need = self.inventory.get(ing), amount * crafts
            if have < need:
                return f"Error: not enough {ing}: have {have}, need {need}."
        for ing, amount in recipe.ingredients.items():
            self.inventory.remove(ing, amount * crafts)
        self.inventory.add(name, count)
        return f"Crafted {count} {name}. Inventory now has {self.inventory.get(name)} {name}."

    def get_info(self, items: Any = None) -> list[dict]:
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, list | tuple):
            return [{"error": "malformed arguments: items must be a list of item names"}]
        return [self._info(name) for name in items]

    def _info(self, name: Any) -> dict:
        item = self.world.items.get(name) if isinstance(name, str) else None
        if item is None:
            return {"item": name if isinstance(name, str) else repr(name), "error": "unknown item"}
        r = item.recipe
        return {
            "item": name,
            "is_base": r is None,
            "in_inventory": self.inventory.get(name),
            "crafting_depth": self.world.depth(name),
            "recipe": None if r is None else {"ingredients": dict(r.ingredients), "output": r.output},
            "can_craft": r is not None and all(self.inventory.get(i) >= a for i, a in r.ingredients.items()),
        }

    def view_inventory(self) -> dict[str, int]:
        return self.inventory.snapshot()


def env_from_task(world: World, task: Task) -> TextCraftEnv:
    """A root environment for a task, on a fresh inventory."""
    return TextCraftEnv(world, Inventory(task.inventory), task.goal_targets)
