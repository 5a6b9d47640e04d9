"""TRL's GRPOConfig for one round, and the choices it is built from: device, bf16, AdamW, LoRA.

Kept apart from trainer.py (the GRPOTrainer subclass) so the settings a round trains with are read
in one place.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig

from rao_core.config import TrainConfig


def world() -> tuple[int, int]:
    """(rank, number of processes) as `accelerate launch` / torchrun set them; (0, 1) when not launched.

    Read from the environment because the micro-batches must be dealt before TRL's config (which
    would know them too) can be built: its gradient accumulation depends on the deal.
    """
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def resolve_device(cfg: TrainConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def with_precision(cfg: TrainConfig, model_path: Path) -> TrainConfig:
    """`train.bf16: null` resolved for the checkpoint a round trains (an adapter: its base): on CUDA,
    and on a CPU with bf16 matrix units when the checkpoint is stored in bf16 (models/dtypes.py)."""
    from rao_core.models.dtypes import auto_dtype
    from rao_core.models.locate import adapter_base, is_adapter

    if cfg.bf16 is not None:
        return cfg
    folder = adapter_base(model_path) if is_adapter(model_path) else model_path
    device = torch.device(resolve_device(cfg)).type
    return dataclasses.replace(cfg, bf16=auto_dtype(device, folder) == "bfloat16")


def adamw_name(cfg: TrainConfig, device: str) -> str:
    """TRL's optimizer: AdamW's fused kernel on CUDA, the plain one elsewhere (the CPU round stays
    bit for bit what it was); `train.fused_adamw` overrides. The fused step updates in place, the
    same update up to rounding, where the plain (foreach) step allocates two full-size temporaries
    one after the other: 4 B/param on top of the 16 of master weights, gradients and moments, at
    the training peak (docs/training.md, "Throughput")."""
    fused = device.startswith("cuda") if cfg.fused_adamw is None else cfg.fused_adamw
    return "adamw_torch_fused" if fused else "adamw_torch"


def lora_config(cfg: TrainConfig) -> Any:
    """A peft LoraConfig, or a clear error: peft is an optional dependency."""
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise ImportError("train.lora=true needs the optional package peft: pip install -e '.[lora]'") from e
    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_targets),
        task_type="CAUSAL_LM",
    )


def grpo_args(
    cfg: TrainConfig, output_dir: Path, accum: int, max_completion: int, temperature: float = 1.0
) -> GRPOConfig:
    """TRL's config for one round: one optimiser step per `accum` micro-batches, nothing saved or reported.

    `temperature` is the one the rows were sampled at (samples.logprob_temperature): TRL divides
    the logits by it before the log-softmax, as the sampler did.

    `per_device_train_batch_size` and `num_generations` are placeholders that satisfy GRPOConfig's
    checks (generation batch divisible by the group size); our dataloader ignores them.
    """
    device = resolve_device(cfg)
    bf16 = device.startswith("cuda") if cfg.bf16 is None else cfg.bf16
    return GRPOConfig(
        output_dir=str(output_dir),
        loss_type=cfg.loss_type,
        epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high,
        beta=0.0,  # TRL would load its reference from the round's input path; RAOTrainer sets beta itself
        temperature=temperature,
        learning_rate=cfg.lr,
        adam_beta1=cfg.betas[0],
        adam_beta2=cfg.betas[1],
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim=adamw_name(cfg, device),
        bf16=bf16,
        fp16=False,
        use_cpu=device == "cpu",
        gradient_checkpointing=cfg.gradient_checkpointing,
        gradient_accumulation_steps=accum,
        per_device_train_batch_size=2,
        num_generations=2,
        num_train_epochs=1,
        max_completion_length=max_completion,
        shuffle_dataset=False,
        disable_dropout=True,
        seed=cfg.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,  # every weight is in the loss's graph (DDP skips a graph walk)
    )
