"""The training stage: policy version N+1 from version N on round N's scored rows (TRL,
rao_core/train/), in the flow's process or as `accelerate launch` on N processes."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from rao_core.config import TrainConfig
from rao_core.engines.open import overlap_share
from rao_core.engines.scope import make_room_for_training
from rao_core.run import Run
from rao_core.stages.common import note


def round_lr(run: Run, round_: int) -> float:
    """The learning rate of round `round_`: linear from train.lr at round 0 to train.lr * lr_final
    at the campaign's last round; rounds added later keep the last value."""
    cfg = run.config
    last = max(1, cfg.campaign.rounds - 1)
    return cfg.train.lr * (1 + (cfg.train.lr_final - 1) * min(round_, last) / last)


def train(run: Run, round_: int) -> dict[str, Any]:
    """Train version round_+1 (train.*, the round's learning rate); returns its metrics. A complete
    checkpoint is returned as it is. With train.accelerate_config, on N processes."""
    from rao_core.train.launch import launch_round  # torch, TRL: only when training
    from rao_core.train.stage import train_round

    cfg, ckpt = run.config, run.checkpoints
    note(run, f"training of round {round_}")
    paths = (run.dir, round_, ckpt.path(round_), run.layout.checkpoint(round_ + 1))
    train_cfg = dataclasses.replace(cfg.train, lr=round_lr(run, round_))
    tokenizer = None if cfg.policy.tokenizer == "auto" else cfg.policy.tokenizer
    if cfg.campaign.max_staleness:  # the engine lane samples meanwhile: its engines stay
        room, threads = contextlib.nullcontext(), trainer_threads(cfg.train)
    else:
        room, threads = make_room_for_training(), contextlib.nullcontext()  # vLLM sleeps (or stops)
    with room, threads:
        if cfg.train.accelerate_config:
            return launch_round(*paths, train_cfg, ckpt.initial(), tokenizer)
        return train_round(*paths, train_cfg, ckpt.initial(), tokenizer)


@contextlib.contextmanager
def trainer_threads(train: TrainConfig) -> Iterator[None]:
    """Rounds that overlap on the CPU: the trainer's share of the cores (engines/open.py,
    overlap_share), so that it and the engine processes do not run more threads than cores."""
    import torch

    from rao_core.train.trl_args import resolve_device

    if resolve_device(train) != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(overlap_share()[1])
    try:
        yield
    finally:
        torch.set_num_threads(before)
