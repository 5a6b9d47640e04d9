"""Benchmark: what recursion costs in wall-clock time on chained deep search.

DeepDive questions chain hops: hop k+1 names the entity hop k found, so a recursive root launches
its sub-agents one after another and nothing overlaps. The scripted expert answers one question per
hop count (1..4, easy..extreme) under an artificial per-turn latency L standing in for model time,
once recursive (the root delegates every hop: launch + one turn per hop, each child search -> view
-> finish) and once single (the root searches and reads itself), one tree at a time. Both are
correct; recursive pays for extra turns on its critical path (about (4k + 1) vs (2k + 1) turns for k
hops), the direction the paper reports (DeepDive recursive up to 18x slower with a real model).

    .venv/bin/python bench/deepdive_bench.py [--latency 0.1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rao_core import interrupts
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.tree import TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.args import DeepDiveArgs
from rao_core.envs.deepdive import HOPS, env_from_task, load_tasks, open_world, synthesize
from rao_core.envs.deepdive.expert import DeepDiveExpert
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.sampler import Sampler


def tree_seconds(world, task, mode: str, latency: float) -> tuple[float, list]:
    cfg = AgentConfig(
        mode=mode, max_depth=4, max_steps=25, max_context_tokens=40960, max_observation_chars=4000,
        reply_format="thought_python", tree_timeout_s=600,
    )  # fmt: skip
    policy = DeepDiveExpert(world.graph, latency_s=latency)
    spec = TreeSpec(task.task_id, 0, env_from_task(world, task))
    start = time.perf_counter()
    (tree,) = Sampler(policy, ChatFraming(tiny_tokenizer()), cfg, SandboxConfig()).run([spec])
    return time.perf_counter() - start, tree.records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.1, help="seconds per model turn")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        synthesize(DeepDiveArgs(), Path(tmp))
        world, tasks = open_world(Path(tmp)), load_tasks(Path(tmp) / "train.parquet")
    print(
        f"L = {args.latency:.2f} s per turn; one {len(world.graph.entities)}-entity graph, one question per hop count"
    )
    print(
        f"{'hops':>4} {'recursive':>10} {'single':>8} {'ratio':>6}   turns (rec / single)   recursive turns x L"
    )
    totals = {"recursive": 0.0, "single": 0.0}
    for difficulty, hops in HOPS.items():
        task = next(t for t in tasks if t.difficulty == difficulty)
        secs, turns = {}, {}
        for mode in ("recursive", "single"):
            secs[mode], records = tree_seconds(world, task, mode, args.latency)
            root = next(r for r in records if r.depth == 0)
            assert root.success == 1.0, f"{mode} failed {task.task_id}"
            turns[mode] = sum(r.turns for r in records)  # chained: wall ~ turns x L means no overlap
            totals[mode] += secs[mode]
        ratio = secs["recursive"] / secs["single"]
        print(
            f"{hops:>4} {secs['recursive']:>9.2f}s {secs['single']:>7.2f}s {ratio:>5.2f}x   "
            f"{turns['recursive']:>5} / {turns['single']:<6}       {turns['recursive'] * args.latency:.2f}s"
        )
    print(
        f"all  {totals['recursive']:>9.2f}s {totals['single']:>7.2f}s {totals['recursive'] / totals['single']:>5.2f}x"
        "   recursive is slower: its wall ~ all its turns x L, so no turn overlapped another"
    )


if __name__ == "__main__":
    interrupts.run_script(main)
