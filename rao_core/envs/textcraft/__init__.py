"""TextCraft-Synth: a seeded crafting world, its tasks, a gold solver, and the environment."""

from rao_core.envs.textcraft.env import Inventory, TextCraftEnv, check_targets, env_from_task
from rao_core.envs.textcraft.solver import base_needs, simulate, solve, tree_needs
from rao_core.envs.textcraft.tasks import (
    Task,
    load_tasks,
    make_tasks,
    synthesize,
    write_tasks,
)
from rao_core.envs.textcraft.world import DOMAINS, Item, Recipe, World, generate_world

__all__ = [
    "DOMAINS",
    "Inventory",
    "Item",
    "Recipe",
    "Task",
    "TextCraftEnv",
    "World",
    "base_needs",
    "tree_needs",
    "check_targets",
    "env_from_task",
    "generate_world",
    "load_tasks",
    "make_tasks",
    "simulate",
    "solve",
    "synthesize",
    "write_tasks",
]
