"""The small TextCraft profile: world rules, seeds, tools, success, and the expert through the runtime."""

from __future__ import annotations

import asyncio
import re

import pytest
from datasets import load_dataset

from rao_core.agent.prompts import ChatFraming
from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.base import LaunchError
from rao_core.envs.textcraft.env import Inventory
from rao_core.envs.textcraft.small import (
    SMALL_DIFFICULTIES,
    VAL_SEED_BASE,
    SmallEnv,
    env_from_small_task,
    generate_small_world,
    load_small_tasks,
    make_small_task,
    make_small_tasks,
    write_small_tasks,
)
from rao_core.envs.textcraft.small_expert import SmallExpert
from rao_core.models.tokenizer import tiny_tokenizer

CHAT = ChatFraming(tiny_tokenizer())


def test_world_is_a_function_of_its_seed():
    assert generate_small_world(7, 4) == generate_small_world(7, 4)
    assert generate_small_world(7, 4) != generate_small_world(8, 4)
    assert make_small_task(7, 3) == make_small_task(7, 3)


@pytest.mark.parametrize("seed", range(30))
def test_world_rules(seed):
    world = generate_small_world(seed, 5)
    assert all(re.fullmatch(r"[a-z][1-9][0-9]?", n) for n in world.tiers)  # short names, 1..99
    for name, tier in world.tiers.items():
        assert world.depth(name) == tier
        recipe = world.recipes.get(name)
        if tier == 0:
            assert recipe is None
            continue
        assert 1 <= len(recipe) <= 3 and len(set(recipe)) == len(recipe)
        assert any(world.tiers[i] == tier - 1 for i in recipe)
        assert all(world.tiers[i] < tier for i in recipe)


def test_train_and_val_worlds_are_disjoint():
    train = make_small_tasks(50, "train")
    val = make_small_tasks(50, "val")
    assert {t.seed for t in train}.isdisjoint(t.seed for t in val)
    assert all(t.seed < VAL_SEED_BASE for t in train) and all(t.seed >= VAL_SEED_BASE for t in val)
    assert {t.difficulty: t.tier for t in val} == SMALL_DIFFICULTIES
    assert len({t.task_id for t in val}) == len(val)


def test_tasks_round_trip_through_parquet(tmp_path):
    tasks = make_small_tasks(3, "val")
    path = write_small_tasks(tasks, tmp_path / "val.parquet")
    assert load_small_tasks(path) == tasks
    rows = load_dataset("parquet", data_files=str(path), split="train")
    assert rows.num_rows == len(tasks) and rows[0]["gold_crafts"] >= 1


def small_env() -> tuple[SmallEnv, str, str, str]:
    """An env on a tier-2 target; returns (env, target, a craftable ingredient, a raw ingredient)."""
    for seed in range(100):
        task = make_small_task(seed, 2)
        env = env_from_small_task(task)
        recipe = env.world.recipes[task.target]
        mid = [i for i in recipe if i in env.world.recipes and env.inventory.get(i) == 0]
        raw = [i for i in recipe if env.world.is_raw(i)]
        if mid and raw and env.inventory.get(task.target) == 0:
            return env, task.target, mid[0], raw[0]
    raise AssertionError("no suitable task")


def test_tools_speak_one_short_line():
    env, target, mid, raw = small_env()
    assert env.info("zz1") == "unknown item zz1" and env.info(3) == "unknown item 3"
    assert env.info(raw) == f"{raw} is raw; have {env.inventory.get(raw)}"
    line = env.info(target)
    assert line.startswith(f"{target} <- ") and "; have 0; missing " in line
    assert mid in line.split("missing ")[1].split(", ")
    assert env.craft(raw) == f"Error: {raw} is raw"
    assert env.craft("zz1") == "Error: unknown item zz1"
    assert env.craft(target).startswith("Error: missing ") and env.inventory.get(target) == 0
    for ing in env.world.recipes[mid]:  # give the intermediate's ingredients, then craft it
        env.inventory.add(ing, 1)
    before = env.inventory.snapshot()
    assert env.craft(mid) == f"crafted {mid}; have 1"
    for ing in env.world.recipes[mid]:
        assert env.inventory.get(ing) == before.get(ing, 0) - 1  # the environment took one of each


def test_fork_rules():
    env, target, mid, raw = small_env()
    child = env.fork(mid)
    assert child.goal_text() == f"make {mid}" and child.inventory is env.inventory
    for bad in (raw, "zz1", 5, None):
        with pytest.raises(LaunchError):
            env.fork(bad)
    with pytest.raises(LaunchError):
        env.fork(mid, "extra")
    assert (SmallEnv.launch_tool, SmallEnv.launch_async, SmallEnv.repl_echo) == ("sub", False, True)


def test_success_means_crafted_not_owned():
    env, target, mid, raw = small_env()
    owner = SmallEnv(env.world, Inventory({target: 1, **env.inventory.snapshot()}), target)
    assert owner.success(True, "") == 0.0  # owns one, crafted none
    for ing in env.world.recipes[target]:
        owner.inventory.add(ing, 1)
    assert owner.craft(target) == f"crafted {target}; have 2"
    assert owner.success(True, "") == 1.0 and owner.success(False, "") == 0.0


def run_expert(
    tasks, mode: str, error_rate: float = 0.0, give_up_rate: float = 0.0, root_inline_rate: float = 0.0
) -> list[tuple[object, TreeRun]]:
    cfg = AgentConfig(
        mode=mode, reply_format="python", max_steps=40, max_context_tokens=4096, cell_timeout_s=5.0
    )
    expert = SmallExpert(error_rate=error_rate, give_up_rate=give_up_rate, root_inline_rate=root_inline_rate)

    specs = [TreeSpec(t.task_id, 0, env_from_small_task(t)) for t in tasks]
    runs = asyncio.run(run_trees(specs, expert, CHAT, cfg, SandboxConfig(), concurrency=len(specs)))
    return list(zip(tasks, runs, strict=True)), expert


def root(run: TreeRun):
    return next(r for r in run.records if r.parent_id is None)


@pytest.mark.parametrize("mode", ["recursive", "single"])
def test_expert_solves_every_task_through_the_runtime(mode):
    tasks = make_small_tasks(4, "val")
    runs, _ = run_expert(tasks, mode)
    full_depth = 0
    for task, run in runs:
        assert root(run).success == 1.0, root(run).transcript[-600:]
        assert all(r.success == 1.0 and r.status == "finished" for r in run.records)
        depth = max(r.depth for r in run.records)
        assert depth <= (task.tier - 1 if mode == "recursive" else 0)  # less if an item was in stock
        full_depth += depth == task.tier - 1
    if mode == "recursive":
        assert full_depth >= len(runs) // 2
        text = root(runs[-1][1]).transcript
        assert "<python>\nsub('" in text and "\ndone\n" in text  # sub() echoes the child's answer


def test_expert_slips_and_repairs():
    runs, expert = run_expert(make_small_tasks(4, "val"), "single", error_rate=0.3)
    assert sum(root(run).success for _, run in runs) == len(runs)  # every slip is repaired
    assert expert.mistakes  # and the slips are on record, so training can mask them
    text = " ".join(root(run).transcript for _, run in runs)
    assert "Error: missing" in text or "unknown item" in text


def test_root_inline_rate_makes_roots_walk_the_task_instead_of_delegating():
    tasks = [t for t in make_small_tasks(8, "val") if t.tier >= 3]
    inline, _ = run_expert(tasks, "recursive", root_inline_rate=1.0)  # never delegates, solves all
    assert all(len(run.records) == 1 and root(run).success == 1.0 for _, run in inline)
    assert all("<python>\nsub(" not in root(run).transcript for _, run in inline)
    mixed, _ = run_expert(tasks * 3, "recursive", root_inline_rate=0.5)
    delegating = [run for _, run in mixed if len(run.records) > 1]
    assert 0 < len(delegating) < len(mixed) and all(root(run).success == 1.0 for _, run in mixed)
    assert any(r.children > 0 for run in delegating for r in run.records if r.depth == 1)  # children delegate
    default, _ = run_expert(tasks, "recursive")  # rate 0: the same trees as before the option
    again, _ = run_expert(tasks, "recursive", root_inline_rate=0.0)
    assert [root(a).transcript for _, a in default] == [root(b).transcript for _, b in again]
    assert all(len(run.records) > 1 for _, run in default)


def test_parents_recover_from_sub_agents_that_give_up():
    runs, expert = run_expert(make_small_tasks(4, "val"), "recursive", give_up_rate=0.5)
    children = [r for _, run in runs for r in run.records if r.depth > 0]
    quitters = [r for r in children if r.success == 0]
    loopers = [r for r in quitters if r.status == "loop"]  # the other way to give up: a repeated slip
    assert loopers and len(loopers) < len(quitters)
    for r in quitters:  # every turn of a quitter is a mistake: masked in SFT
        assert expert.mistakes.get(r.node_id) == set(range(r.turns)), (r.status, r.turns)
    assert sum(root(run).success for _, run in runs) == len(runs)  # every parent re-launched
    by_id = {r.node_id: r for _, run in runs for r in run.records}
    for quitter in quitters:  # its parent learnt of it from the craft error, and launched it again
        parent = by_id[quitter.parent_id].transcript
        assert parent.count(f"sub({quitter.goal.split()[-1]!r})") >= 2 and "Error: missing" in parent
    looper_parents = " ".join(by_id[r.parent_id].transcript for r in loopers)
    assert "Sub-agent failed: repeated the same cell" in looper_parents  # what the model's parents see


def test_launch_result_reports_the_childs_success():
    env, target, mid, raw = small_env()
    child = env.fork(mid)
    assert env.launch_result(child, True) == "failed"  # finished, but crafted nothing
    for ing in env.world.recipes[mid]:
        env.inventory.add(ing, 1)
    assert child.craft(mid) == f"crafted {mid}; have 1"
    assert env.launch_result(child, True) == "done" and env.launch_result(child, False) == "failed"
