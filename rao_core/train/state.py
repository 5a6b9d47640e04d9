"""What the trainer carries from round to round, beside the checkpoint the engines serve.

A round's checkpoint (`checkpoints/version=v/`) is what engines load: the model in its own dtype
(bf16 for most pretrained models), or, with `train.lora`, a LoRA adapter over version 0. The
trainer's own state sits in `trainer_state/` inside the latest checkpoint:

    trainer_state/master/        float32 master weights (full fine-tuning of a bf16 or fp16 model)
    trainer_state/optimizer.pt   AdamW's moments and step count (train.keep_optimizer_state)

Why master weights: an AdamW step moves a weight by about the learning rate, 3e-6 in the paper,
while bf16 can only move a weight of 0.02 in steps of 1.2e-4. A round that restarted from the
served bf16 copy would round its whole update away, and the next round would do the same: RL
would be a silent no-op. Training on from the float32 master makes the campaign one optimisation
whatever the served dtype; the served copy lags the master by less than bf16's resolution.

Why inside the checkpoint: it is published with the served weights by one atomic rename, so a
killed run resumes from a (served, master, moments) triple of the same version. Only the latest
checkpoint keeps it (the stage deletes its input's once its own is in place): for a 4B model the
master and the moments are 48 GB. A float32 model has no master folder: its served weights are
exact. A LoRA adapter is float32 itself: it is its own master.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from rao_core.checkpoints import master_dir


def tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a checkpoint's *.safetensors files, one at a time (a 4B model never sits
    in memory twice)."""
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)


class _Index:
    """Tensor lookup by name across a checkpoint's files."""

    def __init__(self, folder: Path | None) -> None:
        self.files: dict[str, Path] = {}
        for f in sorted(Path(folder).glob("*.safetensors")) if folder is not None else []:
            with safe_open(str(f), framework="pt") as st:
                self.files.update({name: f for name in st.keys()})

    def get(self, name: str) -> torch.Tensor | None:
        if name not in self.files:
            return None
        with safe_open(str(self.files[name]), framework="pt") as st:
            return st.get_tensor(name)


def full_change(
    new: dict[str, torch.Tensor],
    old_served: Path,
    old_master: Path | None,
    origin: Path | None,
    served_dtype: torch.dtype,
) -> dict[str, float]:
    """How far a round moved the weights, read against the files of its input checkpoint.

    - served_changed: share of the served weights (`new` cast to the served dtype) that differ
      from the input checkpoint's: 0 means the engines will sample exactly as before;
    - served_changed_total: the same against version 0 (`origin`): grows round over round when
      updates accumulate;
    - update_rms_ratio: RMS(master update) / RMS(master weights before it).
    """
    served, first = _Index(old_served), _Index(origin)
    changed = changed_total = total = counted_total = 0
    delta_sq = weight_sq = 0.0
    for name, before in tensors(old_master or old_served):
        after = new[name].detach().to("cpu", torch.float32)
        before = before.to(torch.float32)
        delta_sq += float(((after - before) ** 2).sum())
        weight_sq += float((before**2).sum())
        cast = after.to(served_dtype)
        prev = served.get(name) if old_master is not None else before.to(served_dtype)
        changed += int((cast != prev.to(served_dtype)).sum())
        total += cast.numel()
        base = first.get(name)
        if base is not None and base.shape == cast.shape:
            changed_total += int((cast != base.to(served_dtype)).sum())
            counted_total += cast.numel()
    out = {
        "served_changed": changed / max(total, 1),
        "update_rms_ratio": (delta_sq / max(weight_sq, 1e-30)) ** 0.5,
    }
    if counted_total:
        out["served_changed_total"] = changed_total / counted_total
    return out


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the trainable parameters (a LoRA adapter: small)."""
    return {
        n: p.detach().to("cpu", torch.float32).clone() for n, p in model.named_parameters() if p.requires_grad
    }


def adapter_change(before: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, float]:
    """served_changed and update_rms_ratio of a LoRA round: the adapter is what engines load."""
    after = snapshot(model)
    changed = sum(int((after[n] != before[n]).sum()) for n in before)
    total = sum(t.numel() for t in before.values())
    delta_sq = sum(float(((after[n] - before[n]) ** 2).sum()) for n in before)
    weight_sq = sum(float((t**2).sum()) for t in before.values())
    return {
        "served_changed": changed / max(total, 1),
        "update_rms_ratio": (delta_sq / max(weight_sq, 1e-30)) ** 0.5,
    }


def no_change_warning(metrics: dict[str, Any], served_dtype: str) -> str | None:
    """One line when a trained round changed no served weight (the engines sample as before)."""
    if metrics.get("steps") and metrics.get("served_changed") == 0:
        return (
            f"round {metrics.get('round')}: no served weight changed ({served_dtype}); the update "
            "is kept in the trainer's float32 master weights and reaches the engines once it "
            "exceeds the served dtype's resolution (train.lr may be too small to matter)"
        )
    return None


def lost_master_warning(model_path: Path, served_dtype: str) -> str | None:
    """One line when a round started from a narrower-than-float32 checkpoint of a run (not version
    0) that has no master: only a run's latest checkpoint keeps one, so a branch from an earlier
    round restarts from the rounded copy."""
    if served_dtype != "float32" and master_dir(model_path) is None:
        return (
            f"{Path(model_path).name} has no float32 master weights (only a run's latest checkpoint "
            f"keeps them): this round started from its {served_dtype} copy"
        )
    return None
