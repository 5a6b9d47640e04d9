"""The TextCraft environment: craft errors, get_info, shared inventories, and success."""

from __future__ import annotations

import json

import pytest

from rao_core.envs.args import TextCraftArgs
from rao_core.envs.base import LaunchError
from rao_core.envs.textcraft import (
    Inventory,
    TextCraftEnv,
    World,
    base_needs,
    env_from_task,
    generate_world,
    make_tasks,
)

TOY = TextCraftArgs(world_seed=1, domains=2, max_tier=6, items_per_tier=6, cross_domain_items=0)


@pytest.fixture(scope="module")
def world() -> World:
    return generate_world(TOY)


def multi_output_item(world: World) -> str:
    """A tier-2+ item whose recipe yields more than one per craft and needs 2+ ingredients."""
    for tier in range(2, 4):
        for name in world.items_at_tier(tier):
            r = world.items[name].recipe
            if r.output > 1 and len(r.ingredients) >= 2:
                return name
    raise AssertionError("toy world has no multi-output item")


@pytest.fixture()
def setup(world: World):
    """An env whose inventory holds ingredients for exactly two crafts of a multi-output item."""
    name = multi_output_item(world)
    r = world.items[name].recipe
    inv = Inventory({ing: 2 * a for ing, a in r.ingredients.items()})
    env = TextCraftEnv(world, inv, {name: 2 * r.output})
    return env, name, r


def good_ingredients(r, crafts: int = 1) -> dict:
    return {ing: a * crafts for ing, a in r.ingredients.items()}


def test_successful_craft_changes_exact_counts(setup):
    env, name, r = setup
    before = env.view_inventory()
    msg = env.craft(good_ingredients(r, 2), (name, 2 * r.output))
    assert msg == f"Crafted {2 * r.output} {name}. Inventory now has {2 * r.output} {name}."
    after = env.view_inventory()
    assert after == {name: 2 * r.output}  # every ingredient used up, nothing else touched
    assert set(before) == set(r.ingredients)


def test_list_target_from_json(setup):
    env, name, r = setup
    args = json.loads(json.dumps([good_ingredients(r), [name, r.output]]))
    assert env.craft(*args).startswith("Crafted")


@pytest.mark.parametrize(
    "case, expect",
    [
        ("unknown_target", "Error: unknown item 'nope'"),
        ("unknown_ingredient", "Error: unknown item 'zzz' in ingredients"),
        ("base", "is a base material and cannot be crafted"),
        ("not_multiple", "is not a multiple of output"),
        ("wrong_set", "Error: wrong ingredients for"),
        ("wrong_amount", "Error: amount of"),
        ("not_enough", "Error: not enough"),
        ("bad_target", "Error: malformed arguments"),
        ("bad_count", "Error: malformed arguments"),
        ("bad_ingredients", "Error: malformed arguments"),
        ("unhashable", "Error: malformed arguments"),
    ],
)
def test_craft_errors_leave_inventory_unchanged(setup, world: World, case: str, expect: str):
    env, name, r = setup
    first = next(iter(r.ingredients))
    ing = good_ingredients(r)
    calls = {
        "unknown_target": (ing, ("nope", 1)),
        "unknown_ingredient": ({**ing, "zzz": 1}, (name, r.output)),
        "base": ({}, (world.items_at_tier(0)[0], 1)),
        "not_multiple": (ing, (name, r.output + 1)),
        "wrong_set": ({k: v for k, v in ing.items() if k != first}, (name, r.output)),
        "wrong_amount": ({**ing, first: ing[first] + 1}, (name, r.output)),
        "not_enough": (good_ingredients(r, 3), (name, 3 * r.output)),
        "bad_target": (ing, name),
        "bad_count": (ing, (name, "2")),
        "bad_ingredients": ([first], (name, r.output)),
        "unhashable": (ing, ([name], r.output)),
    }
    before = env.view_inventory()
    msg = env.craft(*calls[case])
    assert msg.startswith("Error:") and expect in msg and "\n" not in msg, msg
    assert env.view_inventory() == before


def test_error_details(setup):
    env, name, r = setup
    first = next(iter(r.ingredients))
    msg = env.craft(good_ingredients(r, 3), (name, 3 * r.output))
    assert (
        msg == f"Error: not enough {first}: have {2 * r.ingredients[first]}, need {3 * r.ingredients[first]}."
    )
    msg = env.craft({first: 99}, (name, r.output))
    assert str(sorted(r.ingredients)) in msg
    msg = env.craft({**good_ingredients(r), first: 99}, (name, r.output))
    assert f"must be {r.ingredients[first]} for count {r.output}" in msg
    assert f"multiple of output {r.output}" in env.craft(good_ingredients(r), (name, r.output + 1))
    assert env.craft().startswith("Error:")  # no arguments at all


def test_get_info(setup, world: World):
    env, name, r = setup
    base = world.items_at_tier(0)[0]
    info = env.get_info([name, base, "nope"])
    assert info[0] == {
        "item": name,
        "is_base": False,
        "in_inventory": 0,
        "crafting_depth": world.items[name].tier,
        "recipe": {"ingredients": dict(r.ingredients), "output": r.output},
        "can_craft": True,
    }
    assert info[1]["is_base"] and info[1]["recipe"] is None and info[1]["crafting_depth"] == 0
    assert not info[1]["can_craft"]
    assert info[2] == {"item": "nope", "error": "unknown item"}
    assert env.get_info(name) == [info[0]]
    assert env.get_info(5)[0]["error"].startswith("malformed")
    first = next(iter(r.ingredients))
    env.inventory.remove(first, r.ingredients[first] + 1)  # one short of a single craft
    assert env.get_info([name])[0]["can_craft"] is False


def test_success_crafted_not_owned(setup):
    env, name, r = setup
    owned = TextCraftEnv(env.world, Inventory({name: 10}), {name: 1})
    assert owned.success(True, "done") == 0.0  # owned at start, never crafted
    assert env.success(True, "done") == 0.0
    env.craft(good_ingredients(r, 2), (name, 2 * r.output))
    assert env.success(False, "") == 0.0  # finish not called
    assert env.success(True, "done") == 1.0


def test_child_shares_inventory_and_own_start(setup):
    env, name, r = setup
    env.craft(good_ingredients(r), (name, r.output))  # parent crafts one batch first
    child = env.fork({name: r.output}, context="make the rest")
    assert child.inventory is env.inventory and child.world is env.world
    assert child.start_counts == {name: r.output} and "make the rest" in child.goal_text()
    assert child.success(True, "") == 0.0  # the parent's batch does not count for the child
    child.craft(good_ingredients(r), (name, r.output))
    assert child.success(True, "ok") == 1.0
    assert env.view_inventory()[name] == 2 * r.output and env.success(True, "ok") == 1.0


@pytest.mark.parametrize(
    "targets",
    [
        None,
        {},
        {"nope": 1},
        {"m0_i2_0": 0},
        {"m0_i2_0": -1},
        {"m0_i2_0": 1.5},
        {"m0_i2_0": True},
        ["m0_i2_0"],
    ],
)
def test_fork_validation(setup, targets):
    env, _, _ = setup
    with pytest.raises(LaunchError):
        env.fork(targets)


def test_fork_rejects_bad_context(setup):
    env, name, _ = setup
    with pytest.raises(LaunchError):
        env.fork({name: 1}, context=3)


def test_goal_docs_and_task_env(world: World):
    task = make_tasks(world, TextCraftArgs(tasks_per_item=1), 0)[-1]
    env = env_from_task(world, task)
    assert env.suite == "textcraft" and env.targets() == {task.target: task.count}
    assert env.goal_text() == f"Craft {task.count} {task.target}."
    assert env.view_inventory() == task.inventory and env.inventory.snapshot() is not task.inventory
    assert set(env.tools()) == {"craft", "get_info", "view_inventory"}
    assert set(base_needs(world, task.goal_targets)) <= set(env.view_inventory())
    flat, rec = env.tool_docs(False), env.tool_docs(True)
    assert "launch_subagent" not in flat and "launch_subagent" in rec and "asyncio.gather" in rec
    assert all(w in flat for w in ("craft(", "get_info(", "view_inventory(", "finish(", "Example"))
    assert len(rec) < 1500
    multi = TextCraftEnv(world, Inventory(), {"a": 1, "b": 2})
    assert multi.goal_text() == "Craft 1 a, 2 b."


def test_gold_plan_through_the_tools(world: World):
    """Executing each gold plan with craft() reaches success: the tools and the solver agree."""
    for task in make_tasks(world, TextCraftArgs(tasks_per_item=1, max_count=3), 2):
        env = env_from_task(world, task)
        for name, n in task.gold_plan:
            r = world.items[name].recipe
            msg = env.craft(good_ingredients(r, n), [name, n * r.output])
            assert msg.startswith("Crafted"), msg
        assert env.success(True, "done") == 1.0
