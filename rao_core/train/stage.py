"""The training stage of one round: scored rollouts in, the next policy's Hugging Face checkpoint out.

`train_round` reads the round's trained nodes from the `samples` view, runs the RAO update with
TRL (trainer.py), and writes model + tokenizer + metrics.json to `out_path` atomically: the
checkpoint is built in a hidden temporary folder beside it and renamed into place, so an engine that
finds `out_path` finds a complete checkpoint. Idempotent: a finished `out_path` is returned as is.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rao_core.train.samples import read_rows
from rao_core.train.trainer import TrainConfig, check, resolve_device, train_rows

METRICS = "metrics.json"


def is_complete(path: str | Path) -> bool:
    """A checkpoint is complete once its metrics.json exists: it is written last, before the rename."""
    return (Path(path) / METRICS).is_file()


def saved_dtype(model_path: Path) -> torch.dtype:
    """The dtype the input checkpoint declares; the output is saved in it too (engines load it as is)."""
    dtype = getattr(AutoConfig.from_pretrained(model_path, local_files_only=True), "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def load_policy(model_path: Path, cfg: TrainConfig) -> tuple[Any, Any]:
    """Model and tokenizer from a local checkpoint.

    Full fine-tuning keeps float32 master weights (bf16 runs as autocast on top): an update of
    lr 3e-6 is far below bf16's resolution and would be rounded away in bf16 weights. With LoRA the
    frozen base stays in the checkpoint's dtype and only the adapter trains.
    """
    dtype = saved_dtype(model_path) if cfg.lora else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, local_files_only=True)
    model.to(resolve_device(cfg))
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    return model, tokenizer


def _publish(tmp: Path, out_path: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """Write metrics.json last, then rename the folder into place; a concurrent winner is kept."""
    (tmp / METRICS).write_text(json.dumps(metrics, indent=2, default=str))
    if out_path.exists() and not is_complete(out_path):  # leftover of a crashed non-atomic writer
        shutil.rmtree(out_path)
    try:
        os.rename(tmp, out_path)
    except OSError:
        if not is_complete(out_path):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return json.loads((out_path / METRICS).read_text())
    return metrics


def train_round(
    run_dir: Path, round: int, model_path: Path, out_path: Path, cfg: TrainConfig
) -> dict[str, Any]:
    """Train policy version round+1 on round `round` of `run_dir`, starting from `model_path`.

    Returns the metrics (also in `out_path/metrics.json`): loss, tokens, samples, grad_norm,
    seconds, tokens_per_s, mean_ratio, clipped_fraction, ... With no trainable row the input
    checkpoint is copied forward unchanged (the policy version still advances) and `skipped` says why.
    """
    run_dir, model_path, out_path = Path(run_dir), Path(model_path), Path(out_path)
    check(cfg)
    if is_complete(out_path):
        return json.loads((out_path / METRICS).read_text())
    t0 = time.perf_counter()
    rows = read_rows(run_dir, round)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.parent / f".tmp-{out_path.name}-{uuid.uuid4().hex[:8]}"
    head = {
        "round": round,
        "policy_version": round + 1,
        "model_path": str(model_path),
        "config": dataclasses.asdict(cfg),
    }
    try:
        if not any(r.action_tokens for r in rows):
            shutil.copytree(model_path, tmp, ignore=shutil.ignore_patterns(METRICS))
            reason = "no trained rows" if not rows else "no trainable action tokens"
            metrics = {**head, "samples": len(rows), "steps": 0, "tokens": 0, "skipped": reason}
        else:
            model, tokenizer = load_policy(model_path, cfg)
            with tempfile.TemporaryDirectory(prefix="rao-train-") as work:
                model, metrics = train_rows(model, tokenizer, rows, cfg, Path(work))
            model.to(saved_dtype(model_path)).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            metrics = {**head, **metrics}
            del model  # the flow process lives on: hand the GPU memory back before the next stage
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        metrics["stage_seconds"] = time.perf_counter() - t0
        return _publish(tmp, out_path, metrics)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
