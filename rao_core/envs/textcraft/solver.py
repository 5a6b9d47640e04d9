"""A greedy solver: base-material needs, gold crafting plans, and a plan simulator.

Ingredients always sit at a lower tier than what they make, so walking items from the highest tier
down sees every item's total demand before deciding how often to craft it. Aggregating demand this
way lets result-count surplus of one craft serve several consumers.
"""

from __future__ import annotations

import functools

from rao_core.envs.textcraft.world import World

Plan = list[tuple[str, int]]


def _crafts(
    world: World, stock: dict[str, int], targets: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Crafts per item and base materials short, to make `targets` new copies using `stock`.

    Copies of a target already owned do not count (they must be crafted, not merely owned), so a
    target's stock is never spent; other items' stock is used before crafting more.
    """
    demand = {name: n for name, n in targets.items() if n > 0}
    crafts: dict[str, int] = {}
    short: dict[str, int] = {}
    for tier in range(world.max_tier, -1, -1):
        for name in world.items_at_tier(tier):
            need = demand.get(name, 0)
            if need <= 0:
                continue
            if name not in targets:
                need -= min(need, stock.get(name, 0))
            if need <= 0:
                continue
            recipe = world.items[name].recipe
            if recipe is None:
                short[name] = need
                continue
            n = -(-need // recipe.output)
            crafts[name] = n
            for ing, amount in recipe.ingredients.items():
                demand[ing] = demand.get(ing, 0) + amount * n
    return crafts, short


def base_needs(world: World, targets: dict[str, int]) -> dict[str, int]:
    """Base materials needed to craft `targets` from an empty inventory."""
    return _crafts(world, {}, targets)[1]


def tree_needs(world: World, targets: dict[str, int]) -> dict[str, int]:
    """Base materials needed when every ingredient branch is crafted on its own.

    Sub-agents crafting sibling ingredients at the same time cannot share the surplus of one
    craft's result count, so a task's inventory is sized for this (never less than base_needs).
    """

    @functools.cache
    def needs(item: str, n: int) -> tuple[tuple[str, int], ...]:
        recipe = world.items[item].recipe
        if recipe is None:
            return ((item, n),)
        crafts = -(-n // recipe.output)
        total: dict[str, int] = {}
        for ing, amount in recipe.ingredients.items():
            for base, k in needs(ing, amount * crafts):
                total[base] = total.get(base, 0) + k
        return tuple(total.items())

    out: dict[str, int] = {}
    for item, n in targets.items():
        for base, k in needs(item, n):
            out[base] = out.get(base, 0) + k
    return out


def solve(world: World, inventory: dict[str, int], targets: dict[str, int]) -> Plan | None:
    """A gold plan of (item, crafts) steps, ingredients first; None if the inventory cannot do it."""
    if any(name not in world.items for name in targets):
        return None
    crafts, short = _crafts(world, inventory, targets)
    if short:
        return None
    order = sorted(crafts, key=lambda name: (world.items[name].tier, name))
    return [(name, crafts[name]) for name in order]


def simulate(world: World, inventory: dict[str, int], plan: Plan) -> dict[str, int]:
    """Execute `plan` on a copy of `inventory`; raises ValueError at the first impossible step."""
    inv = dict(inventory)
    for step, (name, n) in enumerate(plan):
        item = world.items.get(name)
        if item is None or item.recipe is None or n <= 0:
            raise ValueError(f"step {step}: cannot craft {n} x {name!r}")
        for ing, amount in item.recipe.ingredients.items():
            if inv.get(ing, 0) < amount * n:
                raise ValueError(f"step {step}: not enough {ing} for {name}")
            inv[ing] -= amount * n
        inv[name] = inv.get(name, 0) + n * item.recipe.output
    return inv


def plan_steps(plan: Plan) -> int:
    """Total crafts of a plan (a craft call with n crafts counts n)."""
    return sum(n for _, n in plan)
