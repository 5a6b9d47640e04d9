"""The numbers a training round reports (metrics.json): loss, ratios, KL, sampler mismatch, throughput.

Summed over every process of a launched round, so rank 0 reports the whole round."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from rao_core.train.flops import throughput

if TYPE_CHECKING:
    from rao_core.train.trainer import RAOTrainer


def sum_over_ranks(trainer: RAOTrainer, values: list[float]) -> list[float]:
    """Element-wise sum over the processes (the values themselves in one process)."""
    acc = trainer.accelerator
    if acc.num_processes == 1:
        return values
    return acc.reduce(torch.tensor(values, dtype=torch.float64, device=acc.device), reduction="sum").tolist()


def round_metrics(
    trainer: RAOTrainer, plan: list, lengths: Sequence[int], seconds: float, flops: float
) -> dict[str, Any]:
    """Loss, ratio and mismatch statistics of the round, summed over every process, and its
    throughput: `lengths` are the rows' lengths by index, `flops` the round's model FLOPs (flops.py).
    `padded_tokens` is what the micro-batches computed on (rows x longest row each)."""
    grad_norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    keys = (
        "tokens", "ratio_sum", "ratio_sq_sum", "clipped", "logp_sum", "first_tokens", "first_diff_sum",
        "first_k3_sum", "kl_sum", "token_masked", "sequence_masked", "truncated",
        "trust_masked",
    )  # fmt: skip
    totals = sum_over_ranks(trainer, [trainer.stats[k] for k in keys] + trainer.step_losses)
    s = dict(zip(keys, totals, strict=False))
    world_size = trainer.accelerator.num_processes
    step_losses = [x / world_size for x in totals[len(keys) :]]  # each rank's loss is its share x W
    n = max(s["tokens"], 1.0)
    tokens = sum(lengths[i] for step in plan for mb in step for i in mb)
    return {
        "steps": len(plan),
        "microbatches": sum(len(step) for step in plan),
        "processes": world_size,
        "parallelism": str(trainer.accelerator.distributed_type.value),  # NO, MULTI_CPU (DDP), FSDP, ...
        "sharded_params": sum(isinstance(p, DTensor) for p in trainer.model_wrapped.parameters()),  # FSDP2's
        "loss": sum(step_losses) / len(step_losses),
        "step_losses": step_losses,
        "grad_norm": float(grad_norms[-1]) if grad_norms else math.nan,
        "grad_norms": [float(g) for g in grad_norms],
        "tokens": tokens,
        "action_tokens": int(s["tokens"]),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "padded_tokens": sum(len(mb) * max(lengths[i] for i in mb) for step in plan for mb in step),
        **throughput(flops, seconds, trainer.accelerator.device, world_size),
        "mean_ratio": s["ratio_sum"] / n,
        "ratio_std": math.sqrt(max(0.0, s["ratio_sq_sum"] / n - (s["ratio_sum"] / n) ** 2)),
        **sampler_mismatch(
            trainer.first_step_diffs, s["first_diff_sum"], s["first_k3_sum"], s["first_tokens"]
        ),
        "clipped_fraction": s["clipped"] / n,
        "mean_action_logp": s["logp_sum"] / n,
        **({"kl_to_reference": s["kl_sum"] / n} if trainer.beta else {}),
        **(corrections(trainer.cfg, s, n) if trainer.cfg.weighs_tokens else {}),
        **{f"kl_guard_{k}": v for k, v in trainer.guard.items() if k != "kl"},  # numbers: MLflow plots them
        **(guard_skipped(trainer.guard) if trainer.guard.get("skipped") else {}),
    }


def guard_skipped(guard: dict[str, float]) -> dict[str, Any]:
    """The KL guard dropped the round (offpolicy.KLGuard): no optimiser step moved a weight."""
    return {
        "steps": 0,
        "skipped": f"kl_guard: sampler mismatch KL {guard['kl']:.3g} > {guard['threshold']:.3g}",
    }


def corrections(cfg: Any, s: dict[str, float], n: float) -> dict[str, float]:
    """The share of the round's action tokens each off-policy correction (offpolicy.py) masked or
    truncated, over every optimiser step."""
    out = {}
    if cfg.token_mask is not None:
        out["token_masked_fraction"] = s["token_masked"] / n
    if cfg.sequence_mask is not None:
        out["sequence_masked_fraction"] = s["sequence_masked"] / n
    if cfg.proximal_anchor:
        out["truncated_fraction"] = s["truncated"] / n
    if cfg.trust_region is not None:
        out["trust_masked_fraction"] = s["trust_masked"] / n
    return out


def sampler_mismatch(
    diffs: list[torch.Tensor], diff_sum: float, k3_sum: float, tokens: float
) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's recomputation with the version the
    round trains (the first optimiser step's tokens; rows with sampler log-probs only): the mean
    absolute log-ratio and the k3 estimate of KL(sampler || trainer) over every process, p99 and max
    over this one's. Near 0 when sampler and trainer agree (same model, same temperature); larger
    when the trees are stale (campaign.max_staleness), which the importance ratio corrects."""
    if not tokens:
        return {}
    values = torch.cat(diffs) if diffs else torch.zeros(0)
    means = {"logprob_diff_mean": diff_sum / tokens, "mismatch_kl": k3_sum / tokens}
    if not values.numel():  # this process had no sampler rows (others did): the means only
        return means
    return {
        **means,
        "logprob_diff_p99": float(torch.quantile(values.double(), 0.99)),
        "logprob_diff_max": float(values.max()),
    }
