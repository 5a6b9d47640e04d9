"""The training stage: RAO's policy gradient (Eq. 5, CISPO) on scored rollouts, with TRL.

    from rao_core.train import TrainConfig, train_round
    metrics = train_round(run_dir, round=3, model_path=ckpt_3, out_path=ckpt_4, cfg=TrainConfig())

Names are imported lazily: importing a sibling module (e.g. rao_core.train.warmstart) does not pay
for TRL's GRPO import. See docs/training.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainConfig", "train_round", "train_rows"]


def __getattr__(name: str) -> Any:
    if name == "train_round":
        from rao_core.train.stage import train_round

        return train_round
    if name in ("TrainConfig", "train_rows"):
        from rao_core.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'rao_core.train' has no attribute {name!r}")
