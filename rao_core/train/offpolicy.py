"""Off-policy corrections: how far a round's trees are from the version that trains on them, and
what the loss does about it (train.token_mask, train.sequence_mask, train.proximal_anchor).

Three log-probs of each action token meet here: mu, the sampler's (recorded with the tree);
pi_prox, the trainer's under the version the round starts from (before its first update); and pi,
the current one, which the loss differentiates. At k = 0 (campaign.max_staleness) pi_prox = mu up
to numerical noise; at k >= 1 the trees come from an older version and the behaviour ratio
pi_prox / mu drifts from 1. Without corrections the loss's ratio is pi / mu (CISPO's weight, clipped
above). The corrections, as AReaL, SkyRL, TRL and prime-rl apply them (shared/spec/async-notes.md):

- token mask (c): tokens whose behaviour ratio lies outside [1/c, c] get weight 0;
- sequence mask (c): a node whose mean behaviour log-ratio lies outside [-log c, log c] gets weight 0;
- proximal anchor (decoupled PPO): the loss's ratio is pi / pi_prox (its clip around pi_prox), and
  each token is weighted by min(pi_prox / mu, behaviour_cap);
- trust region (eps): PPO's clip as a mask on CISPO (MiniMax-M1's general form): a token whose
  ratio pi / old (old = mu, or pi_prox under the anchor) already left [1 - eps, 1 + eps] in the
  direction its advantage pushes gets weight 0, so a stale round cannot push a token further than
  eps past where its sampler had it.

The weight multiplies TRL's per-token loss (its `importance_sampling_ratio` input) and the step's
normaliser stays the count of every action token, so a masked token adds exactly nothing.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import TrainerCallback

from rao_core.config import TrainConfig
from rao_core.train.round_metrics import sum_over_ranks


def behaviour_weights(
    prox: torch.Tensor, mu: torch.Tensor, mask: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The (B, T) weight of each token under `cfg`'s corrections, and how many action tokens each
    correction touched: token_masked, sequence_masked (the tokens of masked nodes), truncated
    (behaviour ratio above the cap, proximal_anchor only). `mask` marks the action tokens; the
    weight elsewhere is irrelevant (the loss masks it) and left at 1."""
    m = mask.bool()
    log_ratio = torch.where(m, prox.float() - mu.float(), torch.zeros_like(prox, dtype=torch.float))
    weight = torch.ones_like(log_ratio)
    counts = {"token_masked": 0.0, "sequence_masked": 0.0, "truncated": 0.0}
    if cfg.token_mask is not None:
        bound = math.log(cfg.token_mask)
        out = m & (log_ratio.abs() > bound)
        weight = weight.masked_fill(out, 0.0)
        counts["token_masked"] = float(out.sum())
    if cfg.sequence_mask is not None:
        n = m.sum(dim=1)
        mean = log_ratio.sum(dim=1) / n.clamp(min=1)
        out_rows = (mean.abs() > math.log(cfg.sequence_mask)) & (n > 0)
        weight = weight.masked_fill(out_rows[:, None], 0.0)
        counts["sequence_masked"] = float(n[out_rows].sum())
    if cfg.proximal_anchor:
        ratio = torch.exp(log_ratio)
        counts["truncated"] = float((m & (ratio > cfg.behaviour_cap)).sum())
        weight = weight * ratio.clamp(max=cfg.behaviour_cap)
    return weight, counts


def trust_region_mask(
    cur: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, eps: float
) -> torch.Tensor:
    """(B, T) bool: the action tokens (`mask`) outside the trust region: ratio cur / old above
    1 + eps with a positive advantage, or below 1 - eps with a negative one (PPO's clip, where
    the clipped term has no gradient). `advantages` is (B,) or (B, T)."""
    log_ratio = cur.float() - old.float()
    adv = advantages.float()
    adv = adv[:, None] if adv.dim() == 1 else adv
    up = (adv > 0) & (log_ratio > math.log1p(eps))
    down = (adv < 0) & (log_ratio < math.log1p(-eps))
    return mask.bool() & (up | down)


def kl_guard(kl: float, history: list[float], cfg: TrainConfig) -> float | None:
    """The threshold the round's mismatch KL `kl` went over, or None when the guard holds still.

    A jump is `kl_guard_factor` x the median of the earlier rounds' KLs (`history`), or above
    `kl_guard_ceiling` whatever came before; a KL at or below `kl_guard_floor` never trips it (at
    k = 0 the KL is numerical noise, where a factor of 10 means nothing)."""
    if cfg.kl_guard == "off" or kl <= cfg.kl_guard_floor:
        return None
    if kl > cfg.kl_guard_ceiling:
        return cfg.kl_guard_ceiling
    past = sorted(history)
    if not past:
        return None
    mid = len(past) // 2
    median = past[mid] if len(past) % 2 else (past[mid - 1] + past[mid]) / 2
    threshold = max(cfg.kl_guard_factor * median, cfg.kl_guard_floor)
    return threshold if kl > threshold else None


class KLGuard(TrainerCallback):
    """train.kl_guard: before the round's first optimiser step, when its tokens' sampler mismatch KL
    (summed over the ranks) jumped (`kl_guard`), skip the round (no weight moves: every gradient is
    dropped and training stops) or scale its learning rate by threshold / KL. What it did is
    `trainer.guard`: metrics.json's kl_guard_threshold and kl_guard_skipped or kl_guard_lr_scale."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        t = self.trainer
        if state.global_step != 0:
            return control
        k3, tokens = sum_over_ranks(t, [t.stats["first_k3_sum"], t.stats["first_tokens"]])
        if not tokens:
            return control
        kl = k3 / tokens
        threshold = kl_guard(kl, t.kl_history, t.cfg)
        if threshold is None:
            return control
        t.guard = {"kl": kl, "threshold": threshold}
        if t.cfg.kl_guard == "skip":
            t.guard["skipped"] = 1
            for p in t.model.parameters():
                p.grad = None  # AdamW leaves a parameter without a gradient as it is, moments and all
            control.should_training_stop = True
        else:
            scale = threshold / kl
            t.guard["lr_scale"] = scale
            for group in t.optimizer.param_groups:
                group["lr"] *= scale
            scheduler = getattr(t.lr_scheduler, "scheduler", t.lr_scheduler)  # accelerate wraps it
            scheduler.base_lrs = [lr * scale for lr in scheduler.base_lrs]
        return control
