"""World generation, the solver, and task synthesis of TextCraft-Synth."""

from __future__ import annotations

import json
import time

import pytest

from rao_core.envs.args import TextCraftArgs
from rao_core.envs.base import select_tasks
from rao_core.envs.textcraft import (
    World,
    base_needs,
    generate_world,
    load_tasks,
    make_tasks,
    simulate,
    solve,
    synthesize,
    tree_needs,
    write_tasks,
)
from rao_core.envs.textcraft.tasks import DIFFICULTIES

TOY = TextCraftArgs(world_seed=1, domains=2, max_tier=6, items_per_tier=6, cross_domain_items=0)
TALL = TextCraftArgs(world_seed=3, domains=3, max_tier=12, items_per_tier=5, cross_domain_items=4)


@pytest.fixture(scope="module")
def toy() -> World:
    return generate_world(TOY)


@pytest.fixture(scope="module")
def tall() -> World:
    return generate_world(TALL)


@pytest.fixture(scope="module")
def toy_tasks(toy: World):
    return make_tasks(toy, TextCraftArgs(tasks_per_item=2, max_count=3), 0)


# --- world -------------------------------------------------------------------------------------
def test_deterministic_by_seed():
    assert generate_world(TOY).to_json() == generate_world(TOY).to_json()
    other = TextCraftArgs(world_seed=2, domains=2, max_tier=6, items_per_tier=6, cross_domain_items=0)
    assert generate_world(other).to_json() != generate_world(TOY).to_json()


def test_depth_equals_tier_and_recipes(toy: World, tall: World):
    for world in (toy, tall):
        for name, item in world.items.items():
            assert world.depth(name) == item.tier
            assert (item.recipe is None) == (item.tier == 0) == world.is_base(name)
            if item.recipe is None:
                continue
            tiers = [world.items[i].tier for i in item.recipe.ingredients]
            assert max(tiers) == item.tier - 1 and min(tiers) >= max(0, item.tier - 4)
            assert item.recipe.output >= 1 and all(a >= 1 for a in item.recipe.ingredients.values())
            if item.domain != "cross":
                assert {world.items[i].domain for i in item.recipe.ingredients} == {item.domain}


def test_ingredient_and_output_rules(tall: World):
    for item in tall.items.values():
        r = item.recipe
        if r is None:
            continue
        assert max(r.ingredients.values()) <= (2 if item.tier <= 3 else 1)
        if item.tier == 1:
            assert len(r.ingredients) == 1 and 2 <= r.output <= 4
        if item.tier >= 6:
            assert r.output == 1
        if item.tier >= 11 and item.domain != "cross":
            assert 4 <= len(r.ingredients) <= 6


def test_names_sizes_and_cross_domain(toy: World, tall: World):
    assert toy.max_tier == 6 and {it.domain for it in toy.items.values()} == {"metal", "crystal"}
    assert "m1_i3_0" in toy.items and toy.items["m1_i3_0"].tier == 3
    sizes = [len(toy.items_at_tier(t)) for t in range(7)]
    assert sizes == sorted(sizes, reverse=True) and min(sizes) >= 2
    cross = [it for it in tall.items.values() if it.domain == "cross"]
    assert len(cross) == 4 and all(10 <= it.tier <= 12 and it.name.startswith("x_i") for it in cross)
    for it in cross:
        assert len({tall.items[i].domain for i in it.recipe.ingredients}) >= 2
    assert not [it for it in toy.items.values() if it.domain == "cross"]  # max_tier < 10


def test_json_round_trip(tall: World):
    back = World.from_json(tall.to_json())
    assert back.items == tall.items and back.max_tier == tall.max_tier
    assert back.to_json() == tall.to_json()


def test_reference_size_world():
    start = time.perf_counter()
    world = generate_world(TextCraftArgs())
    elapsed = time.perf_counter() - start
    assert 1300 <= len(world.items) <= 1600, len(world.items)
    assert world.max_tier == 12 and len(world.items_at_tier(0)) == 125
    print(f"reference world: {len(world.items)} items in {elapsed:.3f}s")


# --- solver ------------------------------------------------------------------------------------
def test_base_needs_and_plan_from_scratch(toy: World):
    for name in toy.items_at_tier(6):
        needs = base_needs(toy, {name: 2})
        assert needs and all(toy.is_base(b) for b in needs)
        plan = solve(toy, needs, {name: 2})
        assert plan is not None
        assert simulate(toy, needs, plan)[name] >= 2
        short = dict(needs)
        first = next(iter(short))
        short[first] -= 1
        assert solve(toy, short, {name: 2}) is None


def test_plan_order_and_intermediates(toy: World):
    target = toy.items_at_tier(5)[0]
    plan = solve(toy, base_needs(toy, {target: 1}), {target: 1})
    tiers = [toy.items[name].tier for name, _ in plan]
    assert tiers == sorted(tiers) and len({n for n, _ in plan}) == len(plan)
    # an intermediate already owned is used instead of crafted again
    ing = max(toy.items[target].recipe.ingredients, key=lambda i: toy.items[i].tier)
    inv = base_needs(toy, {target: 1}) | {ing: 10}
    plan2 = solve(toy, inv, {target: 1})
    assert ing not in dict(plan2) and len(plan2) < len(plan) + 1


def test_owned_target_must_be_crafted(toy: World):
    target = toy.items_at_tier(3)[0]
    assert solve(toy, {target: 5}, {target: 1}) is None
    assert solve(toy, {}, {toy.items_at_tier(0)[0]: 1}) is None  # base materials cannot be crafted
    assert solve(toy, {}, {"nope": 1}) is None


def test_simulate_rejects_impossible_steps(toy: World):
    target = toy.items_at_tier(2)[0]
    with pytest.raises(ValueError):
        simulate(toy, {}, [(target, 1)])
    with pytest.raises(ValueError):
        simulate(toy, {}, [(toy.items_at_tier(0)[0], 1)])


# --- tasks -------------------------------------------------------------------------------------
def test_every_task_is_solvable(toy: World, toy_tasks):
    assert toy_tasks
    for task in toy_tasks:
        after = simulate(toy, task.inventory, task.gold_plan)
        assert after.get(task.target, 0) - task.inventory.get(task.target, 0) >= task.count
        assert 1 <= task.count <= 3 and task.goal_targets == {task.target: task.count}


def test_difficulty_and_tiers(toy: World, toy_tasks):
    craftable = [n for t in range(2, 7) for n in toy.items_at_tier(t)]
    assert {t.target for t in toy_tasks} == set(craftable)  # tier-1 items get no tasks
    for task in toy_tasks:
        lo, hi = DIFFICULTIES[task.difficulty]
        assert lo <= task.depth <= hi and task.depth == toy.items[task.target].tier
    assert len(toy_tasks) == 2 * len(craftable)
    assert len({t.task_id for t in toy_tasks}) == len(toy_tasks)
    assert toy_tasks[0].task_id.startswith(f"tc-{toy_tasks[0].target}-")


def test_split_by_item(toy: World, toy_tasks):
    train = {t.target for t in toy_tasks if t.split == "train"}
    val = {t.target for t in toy_tasks if t.split == "val"}
    assert train and val and not train & val
    for tier in range(2, 7):
        assert any(n in val for n in toy.items_at_tier(tier))


def test_inventory_composition(toy: World):
    cfg = TextCraftArgs(distractors=[2, 3], buffer_max=0.5)
    for task in make_tasks(toy, cfg, 5):
        shared = base_needs(toy, {task.target: task.count})
        needs = tree_needs(toy, {task.target: task.count})
        assert set(needs) == set(shared)
        assert all(toy.is_base(n) for n in task.inventory)
        for name, n in needs.items():
            assert shared[name] <= n <= task.inventory[name] <= n + -(-n // 2)
        distractors = set(task.inventory) - set(needs)
        assert 2 <= len(distractors) <= 3


def test_make_tasks_deterministic(toy: World, toy_tasks):
    again = make_tasks(toy, TextCraftArgs(tasks_per_item=2, max_count=3), 0)
    assert again == toy_tasks
    assert make_tasks(toy, TextCraftArgs(tasks_per_item=2, max_count=3), 1) != toy_tasks


def test_parquet_round_trip_and_datasets(tmp_path, toy_tasks):
    path = write_tasks(toy_tasks, tmp_path / "t.parquet")
    assert load_tasks(path) == toy_tasks
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=str(path), cache_dir=str(tmp_path / "cache"))["train"]
    assert ds.num_rows == len(toy_tasks)
    row = ds[0]
    assert row["task_id"] == toy_tasks[0].task_id
    assert json.loads(row["inventory"]) == toy_tasks[0].inventory
    assert row["gold_steps"] == len(toy_tasks[0].gold_plan)


def test_synthesize_and_select(tmp_path, toy: World):
    paths = synthesize(TOY, 0, tmp_path / "data")
    assert set(paths) == {"world", "train", "val"} and all(p.is_file() for p in paths.values())
    assert World.from_json(paths["world"].read_text()).to_json() == toy.to_json()
    assert not [p for p in (tmp_path / "data").iterdir() if p.name.startswith(".tmp")]
    train, val = load_tasks(paths["train"]), load_tasks(paths["val"])
    assert {t.split for t in train} == {"train"} and {t.split for t in val} == {"val"}
    tasks = train + val
    picked = select_tasks(tasks, "train", ["medium"], 5, seed=3)
    assert len(picked) == 5 and all(t.split == "train" and t.difficulty == "medium" for t in picked)
    assert picked == select_tasks(tasks, "train", ["medium"], 5, seed=3)
    every = select_tasks(tasks, "val", ["easy", "medium"], 10_000, seed=0)
    assert len(every) == sum(1 for t in val if t.difficulty in ("easy", "medium"))
