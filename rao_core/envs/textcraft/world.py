"""TextCraft-Synth: a seeded crafting world deep enough that tasks need recursion.

Item names are meaningless tokens (`m2_i3_7` = domain 2, tier 3, index 7; `x_i11_2` = cross-domain) so a
model cannot lean on priors and must look recipes up. Every craftable item has exactly one shapeless
recipe whose ingredients have lower tiers, at least one of them tier - 1, so crafting depth == tier.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from rao_core.envs.args import TextCraftArgs

DOMAINS = ("metal", "crystal", "organic", "arcane", "tech")
CROSS_MIN_TIER = 10
# (min, max) distinct ingredients by tier
INGREDIENTS = [
    (0, 0),
    (1, 1),
    (1, 2),
    (2, 3),
    (2, 3),
    (2, 3),
    (2, 3),
    (2, 3),
    (3, 4),
    (3, 4),
    (3, 5),
    (4, 6),
    (4, 6),
]


@dataclass(frozen=True)
class Recipe:
    ingredients: dict[str, int]
    output: int  # items one craft yields


@dataclass(frozen=True)
class Item:
    name: str
    domain: str  # "cross" for cross-domain items
    tier: int
    recipe: Recipe | None  # None for base materials (tier 0)


class World:
    """All items by name, plus the lookups the solver, the tasks and the environment need."""

    def __init__(self, items: dict[str, Item]):
        self.items = items
        self.max_tier = max((it.tier for it in items.values()), default=0)
        self._depth: dict[str, int] = {}
        self._by_tier: dict[int, list[str]] = {}
        for it in items.values():
            self._by_tier.setdefault(it.tier, []).append(it.name)

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, name: object) -> bool:
        return name in self.items

    def is_base(self, name: str) -> bool:
        return self.items[name].recipe is None

    def recipe(self, name: str) -> Recipe | None:
        return self.items[name].recipe

    def depth(self, name: str) -> int:
        """Crafting depth, computed from the recipes (not read off the tier) so tests can check both."""
        if name not in self._depth:
            r = self.items[name].recipe
            self._depth[name] = 0 if r is None else 1 + max(self.depth(i) for i in r.ingredients)
        return self._depth[name]

    def items_at_tier(self, tier: int) -> list[str]:
        return list(self._by_tier.get(tier, []))

    def base_items(self) -> list[str]:
        return self.items_at_tier(0)

    def to_json(self) -> str:
        rows = [
            {
                "name": it.name,
                "domain": it.domain,
                "tier": it.tier,
                "recipe": None
                if it.recipe is None
                else {"ingredients": it.recipe.ingredients, "output": it.recipe.output},
            }
            for it in self.items.values()
        ]
        return json.dumps({"items": rows}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> World:
        items = {}
        for row in json.loads(text)["items"]:
            r = row["recipe"]
            recipe = None if r is None else Recipe(dict(r["ingredients"]), int(r["output"]))
            items[row["name"]] = Item(row["name"], row["domain"], int(row["tier"]), recipe)
        return cls(items)


def tier_size(items_per_tier: int, tier: int) -> int:
    """Fewer items as tiers rise: 25 at tier 0, 24 at tier 5, 18 at tier 12."""
    return max(2, round(items_per_tier * (1 - 0.28 * (tier / 12) ** 2)))


def n_ingredients(rng: random.Random, tier: int) -> int:
    """About 1 at tier 1, 2-3 mid, 4-6 at the top."""
    lo, hi = INGREDIENTS[min(tier, len(INGREDIENTS) - 1)]
    return rng.randint(lo, hi)


def output_count(rng: random.Random, tier: int) -> int:
    """2-4 at tier 1, falling to 1 from tier 6."""
    lo, hi = {1: (2, 4), 2: (1, 3), 3: (1, 3), 4: (1, 2), 5: (1, 2)}.get(tier, (1, 1))
    return rng.randint(lo, hi)


def _pick_ingredients(
    rng: random.Random, tier: int, pools: list[dict[int, list[str]]], k: int
) -> dict[str, int]:
    """k distinct ingredients: one from tier - 1, the rest mostly t-1/t-2, at most one from t-4..t-3.

    `pools` holds one {tier: names} per domain to draw from (one for a domain item, several for a
    cross-domain item); the i-th ingredient comes from pools[i % len(pools)].
    """
    chosen: list[str] = [rng.choice(pools[0][tier - 1])]
    far_used = False
    for i in range(1, k):
        pool = pools[i % len(pools)]
        if tier >= 3 and not far_used and rng.random() < 0.15:
            src, far_used = rng.randint(max(0, tier - 4), tier - 3), True
        elif tier >= 2 and rng.random() < 0.35:
            src = tier - 2
        else:
            src = tier - 1
        options = [n for n in pool[src] if n not in chosen]
        if not options:  # small worlds: fall back to tiers t-4..t-1, then to any lower tier
            options = [n for t in range(max(0, tier - 4), tier) for n in pool[t] if n not in chosen]
        if not options:
            options = [n for t in range(tier) for n in pool[t] if n not in chosen]
        if options:
            chosen.append(rng.choice(options))
    return {name: (rng.randint(1, 2) if tier <= 3 else 1) for name in chosen}


def generate_world(cfg: TextCraftArgs) -> World:
    """Build the world from cfg's world settings alone (random.Random(cfg.world_seed)), so a seed
    names a world."""
    rng = random.Random(cfg.world_seed)
    items: dict[str, Item] = {}
    pools: list[dict[int, list[str]]] = []
    for d, domain in enumerate(DOMAINS[: cfg.domains]):
        pool: dict[int, list[str]] = {}
        for t in range(cfg.max_tier + 1):
            pool[t] = []
            for i in range(tier_size(cfg.items_per_tier, t)):
                name = f"m{d}_i{t}_{i}"
                recipe = None
                if t > 0:
                    ingredients = _pick_ingredients(rng, t, [pool], n_ingredients(rng, t))
                    recipe = Recipe(ingredients, output_count(rng, t))
                items[name] = Item(name, domain, t, recipe)
                pool[t].append(name)
        pools.append(pool)
    if cfg.max_tier >= CROSS_MIN_TIER and pools:
        top = list(range(CROSS_MIN_TIER, cfg.max_tier + 1))
        per_tier: dict[int, int] = {}
        for j in range(cfg.cross_domain_items):
            t = top[j % len(top)]
            idx = per_tier[t] = per_tier.get(t, -1) + 1
            doms = rng.sample(range(len(pools)), min(len(pools), rng.randint(2, 3)))
            k = max(len(doms), n_ingredients(rng, t))
            ingredients = _pick_ingredients(rng, t, [pools[d] for d in doms], k)
            name = f"x_i{t}_{idx}"
            items[name] = Item(name, "cross", t, Recipe(ingredients, 1))
    return World(items)
