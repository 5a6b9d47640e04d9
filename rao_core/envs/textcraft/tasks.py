"""TextCraft-Synth tasks: craft N copies of one item, split train/val by item, stored as Parquet.

Each task's inventory holds exactly the base materials its target needs plus a random buffer and a
few distractors, and is checked solvable by the solver, whose plan is kept as the gold trajectory.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rao_core.envs.args import TextCraftArgs
from rao_core.envs.textcraft.solver import simulate, solve, tree_needs
from rao_core.envs.textcraft.world import World, generate_world
from rao_core.store.files import atomic_write

DIFFICULTIES = {"easy": (2, 3), "medium": (4, 6), "hard": (7, 9), "extreme": (10, 12)}  # -> tiers
COLUMNS = ("task_id", "target", "count", "difficulty", "depth", "split", "inventory", "gold_plan")


@dataclass
class Task:
    task_id: str
    target: str
    count: int
    difficulty: str
    depth: int
    split: str
    inventory: dict[str, int]
    gold_plan: list[tuple[str, int]]

    @property
    def goal_targets(self) -> dict[str, int]:
        return {self.target: self.count}

    @property
    def gold_steps(self) -> int:
        """Craft calls in the gold trajectory (one per plan step)."""
        return len(self.gold_plan)

    @property
    def gold_crafts(self) -> int:
        """Total crafts (a step crafting n times counts n)."""
        return sum(n for _, n in self.gold_plan)


def difficulty_of(tier: int) -> str | None:
    for name, (lo, hi) in DIFFICULTIES.items():
        if lo <= tier <= hi:
            return name
    return None


def split_items(world: World, cfg: TextCraftArgs, seed: int) -> dict[str, str]:
    """item -> "train" | "val": cfg.val_fraction of each tier's items (at least one) go to val."""
    rng = random.Random(f"split:{seed}")
    split: dict[str, str] = {}
    for tier in range(1, world.max_tier + 1):
        names = sorted(world.items_at_tier(tier))
        rng.shuffle(names)
        n_val = min(len(names) - 1, max(1, round(cfg.val_fraction * len(names)))) if len(names) > 1 else 0
        for i, name in enumerate(names):
            split[name] = "val" if i < n_val else "train"
    return split


def make_inventory(world: World, target: str, count: int, cfg: TextCraftArgs, rng: random.Random) -> dict:
    """Base needs (sized for independent sub-agents, see tree_needs), each plus ceil(need * U(0,
    buffer_max)), plus unneeded distractor bases."""
    needs = tree_needs(world, {target: count})
    inv = {name: n + math.ceil(n * rng.uniform(0, cfg.buffer_max)) for name, n in sorted(needs.items())}
    others = [name for name in world.base_items() if name not in needs]
    k = min(len(others), rng.randint(cfg.distractors[0], cfg.distractors[1]))
    for name in rng.sample(others, k):
        inv[name] = rng.randint(1, 5)
    return inv


def make_tasks(world: World, cfg: TextCraftArgs, seed: int = 0) -> list[Task]:
    """cfg.tasks_per_item tasks per craftable item whose tier has a difficulty; deterministic in
    `seed` (the run's tasks.seed)."""
    split = split_items(world, cfg, seed)
    tasks = []
    for tier in range(2, world.max_tier + 1):
        difficulty = difficulty_of(tier)
        if difficulty is None:
            continue
        for target in world.items_at_tier(tier):
            rng = random.Random(f"task:{seed}:{target}")  # per item, so tasks don't shift
            for k in range(cfg.tasks_per_item):
                count = rng.randint(1, cfg.max_count)
                inv = make_inventory(world, target, count, cfg, rng)
                plan = solve(world, inv, {target: count})
                if plan is None or simulate(world, inv, plan).get(target, 0) - inv.get(target, 0) < count:
                    raise RuntimeError(f"generated task for {target} x{count} is not solvable")
                task_id = f"tc-{target}-{k}"
                tasks.append(Task(task_id, target, count, difficulty, tier, split[target], inv, plan))
    return tasks


def tasks_table(tasks: list[Task]) -> pa.Table:
    return pa.table(
        {
            "task_id": pa.array([t.task_id for t in tasks], pa.string()),
            "target": pa.array([t.target for t in tasks], pa.string()),
            "count": pa.array([t.count for t in tasks], pa.int64()),
            "difficulty": pa.array([t.difficulty for t in tasks], pa.string()),
            "depth": pa.array([t.depth for t in tasks], pa.int64()),
            "split": pa.array([t.split for t in tasks], pa.string()),
            "inventory": pa.array([json.dumps(t.inventory) for t in tasks], pa.string()),
            "gold_plan": pa.array([json.dumps(t.gold_plan) for t in tasks], pa.string()),
            "gold_steps": pa.array([t.gold_steps for t in tasks], pa.int64()),
            "gold_crafts": pa.array([t.gold_crafts for t in tasks], pa.int64()),
        }
    )


def write_tasks(tasks: list[Task], path: str | Path) -> Path:
    path = Path(path)
    table = tasks_table(tasks)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return path


def load_tasks(path: str | Path) -> list[Task]:
    rows = pq.read_table(path, columns=list(COLUMNS)).to_pylist()
    return [
        Task(
            task_id=r["task_id"],
            target=r["target"],
            count=r["count"],
            difficulty=r["difficulty"],
            depth=r["depth"],
            split=r["split"],
            inventory=json.loads(r["inventory"]),
            gold_plan=[(name, n) for name, n in json.loads(r["gold_plan"])],
        )
        for r in rows
    ]


def synthesize(cfg: TextCraftArgs, seed: int, out_dir: str | Path) -> dict[str, Path]:
    """Generate the world and its tasks (seeded by the run's tasks.seed); write world.json,
    train.parquet, val.parquet."""
    out_dir = Path(out_dir)
    world = generate_world(cfg)
    tasks = make_tasks(world, cfg, seed)
    paths = {"world": out_dir / "world.json"}
    atomic_write(paths["world"], lambda tmp: tmp.write_text(world.to_json()))
    for split in ("train", "val"):
        paths[split] = write_tasks([t for t in tasks if t.split == split], out_dir / f"{split}.parquet")
    return paths
