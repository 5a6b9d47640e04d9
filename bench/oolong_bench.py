"""Benchmark: wall-clock of chunk-and-delegate on Oolong, recursive vs single agent.

The scripted expert answers questions over long synthetic transcripts (default: the extreme
bucket, 64K tokens = 262,144 characters: 9 chunks of 32,000 characters read alone, 8 of ~32,800
delegated, as max_children is 8) under an artificial per-turn latency L standing in for model
time. Recursive: the root inspects, delegates every chunk at once (asyncio.gather), aggregates;
each child inspects and tallies. Single: the root tallies the chunks itself, one turn each.
Prints both wall times per tree, the ratio, and the turn counts that explain it; both must
answer correctly.

    .venv/bin/python bench/oolong_bench.py [--latency 0.2] [--tokens 65536] [--tasks 4]
"""

from __future__ import annotations

import argparse
import time

from rao_core import interrupts
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.tree import TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.args import OolongArgs
from rao_core.envs.oolong import env_from_task, make_tasks
from rao_core.envs.oolong.expert import OolongExpert
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.sampler import Sampler


def run_tree(task, mode: str, latency: float, chunk_chars: int) -> tuple[float, list]:
    agent = AgentConfig(
        mode=mode, max_depth=2, max_steps=25, max_children=8, max_context_tokens=16384,
        cell_timeout_s=30, tree_timeout_s=600, reply_format="thought_python",
    )  # fmt: skip
    policy = OolongExpert(chunk_chars, agent.max_children, agent.max_steps, latency_s=latency)
    spec = TreeSpec(task.task_id, 0, env_from_task(task))
    start = time.perf_counter()
    (tree,) = Sampler(policy, ChatFraming(tiny_tokenizer()), agent, SandboxConfig()).run([spec])
    return time.perf_counter() - start, tree.records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.2, help="seconds per model turn")
    ap.add_argument("--tokens", type=int, default=65536, help="transcript bucket, approx. tokens")
    ap.add_argument("--tasks", type=int, default=4, help="questions (one transcript each)")
    ap.add_argument("--chunk-chars", type=int, default=32000, help="characters per chunk")
    args = ap.parse_args()

    cfg = OolongArgs(seed=7, tasks_per_difficulty=args.tasks, difficulty_tokens={"extreme": [args.tokens]})
    tasks = make_tasks(cfg, "val")
    print(
        f"{len(tasks)} questions over {args.tokens}-token transcripts ({len(tasks[0].context):,} characters)"
    )
    totals, path = {}, {}
    for mode in ("recursive", "single"):
        seconds, turns, scores, nodes = [], [], [], []
        for task in tasks:
            s, records = run_tree(task, mode, args.latency, args.chunk_chars)
            root = next(r for r in records if r.depth == 0)
            kids = [r.turns for r in records if r.depth == 1]
            seconds.append(s)
            scores.append(root.success)
            nodes.append(len(records))
            turns.append(root.turns + (max(kids) if kids else 0))  # turns on the critical path
        totals[mode], path[mode] = sum(seconds) / len(seconds), sum(turns) / len(turns)
        print(
            f"  {mode:9s} L={args.latency:.2f}s  {totals[mode]:.2f} s/tree  nodes/tree {sum(nodes) / len(nodes):.1f}  "
            f"critical-path turns {sum(turns) / len(turns):.1f}  mean score {sum(scores) / len(scores):.2f}"
        )
    ratio, ideal = totals["single"] / totals["recursive"], path["single"] / path["recursive"]
    print(f"  single / recursive wall-clock: {ratio:.2f}x (ideal for these turn counts {ideal:.2f}x)")


if __name__ == "__main__":
    interrupts.run_script(main)
