"""The rollout stage: round N's draw of training trees, sampled with policy version N (N - k with
campaign.max_staleness = k, at least 0) and written as one atomic Parquet partition,
runs/<run>/rollouts/round=N/nodes.parquet.

Scale-out (docs/scale-out.md): with `rollout.shards = S > 1` the round's root tasks are dealt into
S shards; each shard builds its own engine replica and writes `round=N/shard=K/` atomically, and the
round is sealed (its marker lists the shards) once all are complete. Shards run one after another
here, or in parallel as Ray tasks (flows/training.py); either way a complete shard is never rerun.
"""

from __future__ import annotations

from pathlib import Path

from rao_core.run import Run
from rao_core.sampler import Draw, tree_seed
from rao_core.stages.common import note, run_sharded, sample, shard_dir


def training_draw(run: Run, round_: int, shard: tuple[int, int] = (0, 1)) -> Draw:
    """Round `round_`'s trees: rollout.num_tasks tasks (a new draw each round), rollout.group_size
    trees each, sampled at policy.temperature."""
    cfg = run.config
    r = cfg.rollout
    return Draw(
        r.split, tuple(r.difficulty), r.num_tasks, r.group_size, cfg.policy.temperature,
        task_seed=cfg.tasks.seed + round_, tree_seed=tree_seed(r.seed, round_), shard=shard,
    )  # fmt: skip


def sampling_version(run: Run, round_: int) -> int:
    """The policy version round `round_` samples with: max(0, round - campaign.max_staleness). With
    k = 0 each round samples with the version it trains; with k >= 1 the rollout of round r can run
    while version r - k + 1 .. r are still being trained (docs/overlap.md)."""
    return max(0, round_ - run.config.campaign.max_staleness)


def roll_out(run: Run, round_: int, progress: bool = False) -> Path:
    """Roll out round `round_` with policy version `sampling_version(run, round_)`; a complete round
    is not run again."""
    note(run, f"rollout of round {round_}")
    dest, n = run.layout.rollouts(round_), run.config.rollout.shards
    return run_sharded(dest, n, f"round {round_}", lambda k: roll_out_shard(run, round_, k, progress))


def roll_out_shard(run: Run, round_: int, shard: int, progress: bool = False) -> Path:
    """Shard `shard` of round `round_`: its share of the root tasks, G trees each, on an engine
    replica of its own, written as its own partition. Idempotent, so a retried shard whose
    partition is complete is a no-op and an incomplete one is rewritten whole."""
    n = run.config.rollout.shards
    dest = shard_dir(run.layout.rollouts(round_), shard, n)
    version = sampling_version(run, round_)
    return sample(
        run, dest, training_draw(run, round_, (shard, n)), version, progress=progress, round_=round_
    )
