"""TextCraft-Synth, small-model profile: a fresh tiny world per episode and one-name actions.

Why a second profile: a probe (shared/spec/tiny-model-notes.md) found that a 1.8M-parameter model on
one fixed world with dict-literal actions memorises recipes and solves 0% of held-out tasks, while
with a NEW random world for every episode, short names (`e73`) and actions that take one name and no
numbers, a 0.5-2M model learns the agent loop in minutes and a recursive agent generalises to depths
it never trained on. The reference profile (env.py) keeps the paper's tools for real models.

Rules of the small world:
- tiers 0..max_tier; tier 0 items are raw; every recipe makes ONE item from 1-3 distinct
  ingredients (one of each), at least one from the tier below, so crafting depth == tier;
- unused items of each tier are distractors; the inventory holds exactly the raw materials the
  target's recipe tree needs, sometimes one intermediate or the target itself, and unneeded raws;
- tools: `info(x)` -> `e73 <- s14, z98; have 0; missing z98`, `craft(x)` crafts one (the
  environment takes the ingredients), `finish()`; recursive shape: `sub(x)`, a blocking call that
  runs a child episode on the shared inventory whose goal is `make x`.
"""

from __future__ import annotations

import json
import random
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rao_core.envs.base import Environment, LaunchError
from rao_core.envs.textcraft.env import Inventory
from rao_core.store.files import atomic_write

SMALL_DIFFICULTIES = {"easy": 2, "medium": 3, "hard": 4, "extreme": 5}  # difficulty -> target tier
VAL_SEED_BASE = 1 << 40  # training worlds use seeds below, validation worlds at or above: disjoint
RAW_PER_WORLD = (4, 7)
ITEMS_PER_TIER = (2, 3)
N_INGREDIENTS = ((1, 2, 3), (3, 5, 2))  # values, weights


# --- the world ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SmallWorld:
    tiers: dict[str, int]  # every item -> tier
    recipes: dict[str, tuple[str, ...]]  # craftable item -> its distinct ingredients, one of each

    def is_raw(self, name: str) -> bool:
        return name in self.tiers and name not in self.recipes

    def at_tier(self, tier: int) -> list[str]:
        return [n for n, t in self.tiers.items() if t == tier]

    def depth(self, name: str) -> int:
        """Crafting depth from the recipes (tests check it equals the tier)."""
        r = self.recipes.get(name)
        return 0 if r is None else 1 + max(self.depth(i) for i in r)

    def expansion(self, name: str) -> Counter[str]:
        """How often each item occurs in the full recipe tree of one `name` (itself included)."""
        out: Counter[str] = Counter([name])
        for ing in self.recipes.get(name, ()):
            out.update(self.expansion(ing))
        return out


def generate_small_world(seed: int, max_tier: int) -> SmallWorld:
    """A world from its seed alone; names are a letter and 1..99, unique within the world."""
    rng = random.Random(f"small-world:{seed}:{max_tier}")
    sizes = [rng.randint(*RAW_PER_WORLD)] + [rng.randint(*ITEMS_PER_TIER) for _ in range(max_tier)]
    names = iter(rng.sample([f"{c}{i}" for c in string.ascii_lowercase for i in range(1, 100)], sum(sizes)))
    tiers: dict[str, int] = {}
    recipes: dict[str, tuple[str, ...]] = {}
    by_tier: list[list[str]] = []
    for t, size in enumerate(sizes):
        by_tier.append([next(names) for _ in range(size)])
        for name in by_tier[t]:
            tiers[name] = t
            if t == 0:
                continue
            k = rng.choices(*N_INGREDIENTS)[0]
            chosen = [rng.choice(by_tier[t - 1])]
            lower = [n for tt in range(t) for n in by_tier[tt]]
            for _ in range(k - 1):  # extras: half raw, half any lower tier (keeps trees small)
                pool = by_tier[0] if rng.random() < 0.5 else lower
                options = [n for n in pool if n not in chosen]
                if options:
                    chosen.append(rng.choice(options))
            rng.shuffle(chosen)
            recipes[name] = tuple(chosen)
    return SmallWorld(tiers, recipes)


# --- tasks --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SmallTask:
    task_id: str
    seed: int  # names the world: generate_small_world(seed, tier)
    tier: int
    difficulty: str
    split: str
    target: str
    inventory: dict[str, int]

    @property
    def gold_crafts(self) -> int:
        """Crafts the shortest solution makes (pre-owned intermediates spare their subtrees)."""
        return _crafts(generate_small_world(self.seed, self.tier), self.target, dict(self.inventory))


def _crafts(world: SmallWorld, item: str, inv: dict[str, int]) -> int:
    n = 1
    for ing in world.recipes[item]:
        if inv.get(ing, 0) > 0:
            inv[ing] -= 1
        elif ing in world.recipes:
            n += _crafts(world, ing, inv)
    return n


def difficulty_of_tier(tier: int) -> str:
    return next((d for d, t in SMALL_DIFFICULTIES.items() if t == tier), f"tier{tier}")


def make_small_task(seed: int, tier: int, split: str = "train") -> SmallTask:
    """One task: a random tier-`tier` target of the world `seed`, and a matching inventory."""
    world = generate_small_world(seed, tier)
    rng = random.Random(f"small-task:{seed}:{tier}")
    target = rng.choice(world.at_tier(tier))
    tree = world.expansion(target)
    inv: Counter[str] = Counter()
    once = [n for n, c in tree.items() if c == 1 and n in world.recipes and n != target]
    owned = rng.choice(once) if once and rng.random() < 0.25 else None  # an intermediate in stock
    skip = world.expansion(owned) if owned else Counter()
    if owned:
        skip[owned] -= 1  # its subtree needs no raws, but the item itself is owned
        inv[owned] = 1
    for name, count in (tree - skip).items():
        if world.is_raw(name):
            inv[name] += count
    if rng.random() < 0.1:
        inv[target] += 1  # owning the target is not enough: it must be crafted
    spare = [n for n in world.at_tier(0) if n not in inv]
    for name in rng.sample(spare, min(len(spare), rng.randint(0, 2))):
        inv[name] = rng.randint(1, 3)  # distractors
    task_id = f"small-{split}-t{tier}-{seed}"
    return SmallTask(task_id, seed, tier, difficulty_of_tier(tier), split, target, dict(sorted(inv.items())))


def make_small_tasks(
    n_per_difficulty: int,
    split: str = "val",
    difficulties: tuple[str, ...] = tuple(SMALL_DIFFICULTIES),
    seed: int = 0,
) -> list[SmallTask]:
    """n tasks per difficulty, each in its own world; val seeds never collide with train seeds."""
    rng = random.Random(f"small-tasks:{split}:{seed}")
    base = VAL_SEED_BASE if split == "val" else 0
    seeds = rng.sample(range(VAL_SEED_BASE), n_per_difficulty * len(difficulties))
    return [
        make_small_task(base + seeds[i * n_per_difficulty + j], SMALL_DIFFICULTIES[d], split)
        for i, d in enumerate(difficulties)
        for j in range(n_per_difficulty)
    ]


def train_seed(rng: random.Random) -> int:
    """A training world seed (never a validation one)."""
    return rng.randrange(VAL_SEED_BASE)


COLUMNS = ("task_id", "seed", "tier", "difficulty", "split", "target", "inventory")


def write_small_tasks(tasks: list[SmallTask], path: str | Path) -> Path:
    path = Path(path)
    table = pa.table(
        {
            "task_id": pa.array([t.task_id for t in tasks], pa.string()),
            "seed": pa.array([t.seed for t in tasks], pa.int64()),
            "tier": pa.array([t.tier for t in tasks], pa.int64()),
            "difficulty": pa.array([t.difficulty for t in tasks], pa.string()),
            "split": pa.array([t.split for t in tasks], pa.string()),
            "target": pa.array([t.target for t in tasks], pa.string()),
            "inventory": pa.array([json.dumps(t.inventory) for t in tasks], pa.string()),
            "gold_crafts": pa.array([t.gold_crafts for t in tasks], pa.int64()),
        }
    )
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return path


def load_small_tasks(path: str | Path) -> list[SmallTask]:
    rows = pq.read_table(path, columns=list(COLUMNS)).to_pylist()
    return [SmallTask(**{**r, "inventory": json.loads(r["inventory"])}) for r in rows]


# --- the environment ----------------------------------------------------------------------------
# Short on purpose: a tiny model reads these tokens in every node of every episode.
TOOL_DOCS = "info(x): recipe, count, missing. craft(x): make one x."
SUB_DOCS = " sub(x): a sub-agent makes one x."
FINISH_DOCS = " Then finish('done')."


class SmallEnv(Environment):
    suite = "textcraft-small"
    launch_tool = "sub"
    launch_async = False  # a blocking call: one child at a time, which is all this profile needs
    repl_echo = True  # a bare `info('e73')` cell prints its result
    shared_state = True  # one inventory per tree

    def __init__(self, world: SmallWorld, inventory: Inventory, target: str) -> None:
        self.world, self.inventory, self.target = world, inventory, target
        self.start_count = inventory.get(target)

    def goal_text(self) -> str:
        return f"make {_q(self.target)}"

    def targets(self) -> dict[str, int]:
        return {self.target: 1}

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {"info": self.info, "craft": self.craft}

    def tool_docs(self, recursive: bool) -> str:
        return TOOL_DOCS + (SUB_DOCS if recursive else "") + FINISH_DOCS

    def fork(self, name: Any = None, *args: Any, **kwargs: Any) -> SmallEnv:
        if args or kwargs:
            raise LaunchError("sub takes one item name")
        if not isinstance(name, str) or name not in self.world.tiers:
            raise LaunchError(f"unknown item {_q(name)}")
        if self.world.is_raw(name):
            raise LaunchError(f"{_q(name)} is raw")
        return SmallEnv(self.world, self.inventory, name)

    def success(self, finished: bool, finish_message: str) -> float:
        """Finished, and at least one target crafted since this node started (owning is not enough)."""
        return float(finished and self.inventory.get(self.target) - self.start_count >= 1)

    def launch_result(self, child: SmallEnv, finished: bool, message: str = "") -> str:
        """What `sub` should return: `done` or `failed`, by the child's own success. Not yet called
        by the runtime, which returns the child's finish message (`done` from the expert's
        `finish('done')`) or a failure line; see docs/small-profile.md, runtime notes."""
        return "done" if child.success(finished, message) else "failed"

    # --- tools: one name in, one short line out; never raise ---------------------------------
    def missing(self, name: str) -> list[str]:
        return [i for i in self.world.recipes.get(name, ()) if self.inventory.get(i) < 1]

    def info(self, name: Any = None, *_: Any, **__: Any) -> str:
        if not isinstance(name, str) or name not in self.world.tiers:
            return f"unknown item {_q(name)}"
        have = self.inventory.get(name)
        if self.world.is_raw(name):
            return f"{_q(name)} is raw; have {have}"
        recipe, missing = _qs(self.world.recipes[name]), _qs(self.missing(name)) or "none"
        return f"{_q(name)} <- {recipe}; have {have}; missing {missing}"

    def craft(self, name: Any = None, *_: Any, **__: Any) -> str:
        if not isinstance(name, str) or name not in self.world.tiers:
            return f"Error: unknown item {_q(name)}"
        if self.world.is_raw(name):
            return f"Error: {_q(name)} is raw"
        if lacking := self.missing(name):
            return f"Error: missing {_qs(lacking)}"
        for ing in self.world.recipes[name]:
            self.inventory.remove(ing, 1)
        self.inventory.add(name, 1)
        return f"crafted {_q(name)}; have {self.inventory.get(name)}"


def _q(name: Any) -> str:
    """A name as shown to the model: bare, like `e73` (the tokenizer spells it the same in a goal,
    in tool output and in a cell); anything else as its short repr."""
    return name if isinstance(name, str) and name.isidentifier() and len(name) <= 8 else repr(name)[:20]


def _qs(names: Any) -> str:
    return ", ".join(_q(n) for n in names)


def env_from_small_task(task: SmallTask) -> SmallEnv:
    """A root environment for a task: its world regenerated from the seed, a fresh inventory."""
    return SmallEnv(generate_small_world(task.seed, task.tier), Inventory(task.inventory), task.target)
