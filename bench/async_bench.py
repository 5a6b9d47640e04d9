"""Benchmark: rounds that overlap (campaign.max_staleness = 1) against rounds in turn (k = 0),
through the real flow (`rao-train`: Prefect tasks, the run folder, scoring in DuckDB, reports),
with a simulated engine and a simulated trainer so that only the schedule is measured:

- the engine: the suite's scripted expert, answering after `--token-ms` per token it writes (a
  fixed per-token latency; the cells it writes run in the REPL workers as usual);
- the trainer: `--steps` steps of `--step-s` seconds each, then the checkpoint copied forward (the
  versions advance, the weights do not change).

Prints `simulated: k=0 A s, k=1 B s, ideal C s`, C being the sum over rounds of max(rollout,
train) measured in the k = 0 run (what a perfect overlap of those two would take), and the ratios.
The first rollout and the last training cannot overlap anything, so B >= C + one rollout.

    .venv/bin/python bench/async_bench.py [--rounds 12] [--token-ms 0.5] [--steps 4] [--step-s 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from unittest import mock

from rao_core import checkpoints, interrupts
from rao_core.layout import METRICS
from rao_core.policy import Generation, GenerationRequest, Policy
from rao_core.run import load_config
from rao_core.stages import common
from rao_core.store.parquet import read_meta

TOY = [  # a small crafting world, the scripted expert, short budgets, no MLflow
    "suite=textcraft", "agent.reply_format=thought_python", "agent.max_context_tokens=8192",
    "agent.max_new_tokens=512", "agent.max_steps=25", "policy.kind=scripted", "policy.model=tiny",
    "policy.error_rate=0.3", "suite_args.domains=2", "suite_args.max_tier=6", "suite_args.items_per_tier=6",
    "suite_args.cross_domain_items=0", "suite_args.tasks_per_item=1", "rollout.difficulty=easy,medium",
    "rollout.num_tasks=4", "rollout.group_size=4", "eval.num_tasks=1", "eval.difficulty=easy",
    "scoring.zero_advantage_groups=keep", "tracking.enabled=false",
]  # fmt: skip


class TimedExpert(Policy):
    """The scripted expert, as slow as an engine of `token_s` seconds per sampled token."""

    def __init__(self, expert: Policy, tokenizer, token_s: float) -> None:
        self.expert, self.tokenizer, self.token_s = expert, tokenizer, token_s

    async def generate(self, request: GenerationRequest) -> Generation:
        reply = await self.expert.generate(request)
        await asyncio.sleep(self.token_s * len(self.tokenizer(reply.text)["input_ids"]))
        return reply

    async def close(self) -> None:
        await self.expert.close()


def simulated_trainer(steps: int, step_s: float):
    def train_round(run_dir, round, model_path, out_path, cfg, origin=None, tokenizer=None) -> dict:
        start = time.perf_counter()
        time.sleep(steps * step_s)
        tmp = Path(out_path).parent / f".tmp-{Path(out_path).name}-simulated"
        shutil.copytree(model_path, tmp, ignore=shutil.ignore_patterns(METRICS))
        metrics = {"round": round, "policy_version": round + 1, "steps": steps, "samples": 0,
                   "skipped": "simulated trainer", "seconds": time.perf_counter() - start}  # fmt: skip
        return checkpoints.publish(tmp, Path(out_path), metrics)

    return train_round


def campaign(runs_dir: Path, k: int, args: argparse.Namespace) -> dict[str, float]:
    """One simulated campaign through the flow; its wall time and each round's rollout and train seconds."""
    from flows.training import train_flow

    real_open = common.open_policy

    def open_policy(run, suite, version, context, role="policy"):
        expert, tokenizer = real_open(run, suite, version, context, role)
        return TimedExpert(expert, tokenizer, args.token_ms / 1000), tokenizer

    ov = [f"runs_dir={runs_dir}", *TOY, f"campaign.rounds={args.rounds}", f"campaign.max_staleness={k}"]
    layout = load_config(overrides=ov).layout
    with (
        mock.patch.object(common, "open_policy", open_policy),
        mock.patch("rao_core.train.stage.train_round", simulated_trainer(args.steps, args.step_s)),
    ):
        start = time.perf_counter()
        train_flow(overrides=ov)
        wall = time.perf_counter() - start
    rollout = [read_meta(layout.rollouts(r))["seconds"] for r in range(args.rounds)]
    train = [checkpoints.Checkpoints(layout, "tiny").metrics(r + 1)["seconds"] for r in range(args.rounds)]
    return {"wall": wall, "ideal": sum(max(a, b) for a, b in zip(rollout, train, strict=True)),
            "rollout": sum(rollout), "train": sum(train)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--token-ms", type=float, default=0.5, help="the engine's latency per token")
    parser.add_argument("--steps", type=int, default=4, help="training steps per round")
    parser.add_argument("--step-s", type=float, default=1.5, help="seconds per training step")
    args = parser.parse_args()
    from flows.prefect_server import temporary_server

    with tempfile.TemporaryDirectory(prefix="rao-async-bench-") as tmp, temporary_server():
        k0 = campaign(Path(tmp) / "k0", 0, args)
        k1 = campaign(Path(tmp) / "k1", 1, args)
    print(
        f"rounds {args.rounds}: rollouts {k0['rollout']:.1f} s, training {k0['train']:.1f} s in all (k=0 run)"
    )
    print(f"simulated: k=0 {k0['wall']:.1f} s, k=1 {k1['wall']:.1f} s, ideal {k0['ideal']:.1f} s")
    print(f"k=1 / k=0 {k1['wall'] / k0['wall']:.2f}, k=1 / ideal {k1['wall'] / k0['ideal']:.2f}")


if __name__ == "__main__":
    interrupts.run_script(main)
