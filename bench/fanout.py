"""Benchmark: does recursion buy wall-clock time, and what does a turn cost the orchestrator?

1. Fan-out: a root whose target needs 3 independent craftable ingredients delegates them to 3
   children (flat below, depth cap 1), under an artificial per-turn latency L standing in for model
   time. Run once with `asyncio.gather` (siblings concurrent) and once awaiting children one after
   another; print both wall times and the speedup (the limit is about 3x; the paper reports 2.5x).
2. Overhead: many recursive trees with zero latency; print node-turns per second and the
   orchestration cost per turn (sandbox round trips, tool calls, tokenisation, worker starts).

    .venv/bin/python bench/fanout.py [--latency 0.2]
"""

from __future__ import annotations

import argparse
import time

from rao_core import interrupts
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.tree import TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.args import TextCraftArgs
from rao_core.envs.textcraft import (
    DOMAINS,
    Inventory,
    Item,
    Recipe,
    TextCraftEnv,
    World,
    base_needs,
    generate_world,
    solve,
)
from rao_core.envs.textcraft.expert import TextCraftExpert
from rao_core.eval.metrics import load_round, summarize
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.run import Run, load_config
from rao_core.sampler import Sampler
from rao_core.stages.rollout import roll_out


def bench_world(longest: int = 34) -> tuple[World, str, list[int]]:
    """The reference world plus one bench item made of 3 items from 3 different domains with flat
    plans of equal length, so the 3 children share no intermediate item (domains are disjoint),
    are truly independent, and take the same number of turns."""
    world = generate_world(TextCraftArgs())
    steps = {
        name: len(solve(world, base_needs(world, {name: 1}), {name: 1}) or [])
        for name, item in sorted(world.items.items())
        if item.recipe is not None and item.domain in DOMAINS[:3] and item.tier <= 7
    }
    for n in range(longest, 0, -1):
        parts = [
            next((k for k, v in steps.items() if v == n and world.items[k].domain == d), None)
            for d in DOMAINS[:3]
        ]
        if all(parts):
            break
    tier = 1 + max(world.items[p].tier for p in parts)
    target = Item("bench_x", "cross", tier, Recipe({p: 1 for p in parts}, 1))
    return World({**world.items, target.name: target}), target.name, [n] * 3


def fan_out_seconds(world, target: str, parallel: bool, latency: float) -> tuple[float, list]:
    env = TextCraftEnv(world, Inventory(base_needs(world, {target: 1})), {target: 1})
    policy = TextCraftExpert(world, latency_s=latency, parallel=parallel, inspect=False)
    cfg = AgentConfig(
        max_depth=1, max_steps=40, tree_timeout_s=600, reply_format="thought_python", max_context_tokens=8192
    )
    start = time.perf_counter()
    (tree,) = Sampler(policy, ChatFraming(tiny_tokenizer()), cfg, SandboxConfig()).run(
        [TreeSpec("bench", 0, env)]
    )
    return time.perf_counter() - start, tree.records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.2, help="seconds per model turn")
    ap.add_argument("--trees", type=int, default=32, help="trees for the overhead measurement")
    args = ap.parse_args()

    world, target, lens = bench_world()
    print(f"fan-out target {target} (tier {world.items[target].tier}); child flat plans {lens} crafts")
    par, recs = fan_out_seconds(world, target, True, args.latency)
    seq, _ = fan_out_seconds(world, target, False, args.latency)
    root = next(r for r in recs if r.depth == 0)
    turns = sorted(r.turns for r in recs if r.depth == 1)
    ok = all(r.success == 1.0 for r in recs)
    print(f"  root turns {root.turns}, child turns {turns}, all succeeded: {ok}")
    print(f"  L={args.latency:.2f}s  concurrent {par:.2f}s  sequential {seq:.2f}s  speedup {seq / par:.2f}x")
    ideal = (root.turns + sum(turns)) / (root.turns + max(turns))
    print(f"  ideal speedup for these turn counts {ideal:.2f}x; achieved {seq / par / ideal:.0%} of it")

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [
            f"runs_dir={tmp}", "run_name=bench", "suite=textcraft", "policy.kind=scripted", "policy.error_rate=0",
            "agent.reply_format=thought_python", "agent.max_context_tokens=8192", "rollout.difficulty=medium",
            f"rollout.num_tasks={args.trees // 2}", "rollout.group_size=2",
        ])  # fmt: skip
        start = time.perf_counter()
        roll_out(Run(cfg), 0)
        wall = time.perf_counter() - start
        s = summarize(load_round(cfg.layout, 0))
    print(
        f"overhead: {s['trees']} trees, {s['nodes']} nodes, {s['node_turns']} node-turns in {wall:.2f}s "
        f"(incl. writing Parquet): {s['node_turns'] / wall:.0f} node-turns/s, "
        f"{1000 * wall / s['node_turns']:.2f} ms per turn, {s['nodes'] / wall:.0f} nodes/s"
    )


if __name__ == "__main__":
    interrupts.run_script(main)
