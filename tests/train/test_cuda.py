"""The training stage on a GPU (the `gpu` tier: skipped, with its reason, where CUDA is absent).

- one round through `train_round` on CUDA: bf16 autocast over float32 master weights, a bf16 copy
  served, fused AdamW, throughput reported;
- the memory plan (rao_core/memory.py, what `rao train --check` prints) against
  `torch.cuda.max_memory_allocated` of the same step, at Qwen3-1.7B's shapes (random weights).

Each test takes well under a minute on an H200. `pytest tests/train/test_cuda.py -rP` prints the
measured figures.
"""

from __future__ import annotations

import gc
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from rao_core import memory
from rao_core.checkpoints import master_dir, optimizer_file
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.run import load_config
from rao_core.train.flops import peak_bf16_tflops
from rao_core.train.samples import Row, make_row
from rao_core.train.stage import load_policy, train_round
from rao_core.train.trainer import TrainConfig, train_rows
from tests.train.test_master_weights import bf16_checkpoint
from tests.train.test_stage import write_round

pytestmark = pytest.mark.gpu

QWEN3_1_7B = dict(  # Qwen3-1.7B's shapes: 1.72B parameters, the embedding tied to the LM head
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    tie_word_embeddings=True,
)  # fmt: skip
BUDGET = 2048  # train.max_tokens_per_microbatch of the memory test: 2 micro-batches of 4 x 512 tokens


def test_one_round_on_cuda_trains_float32_master_weights_under_bf16(tmp_path):
    run, v0, v1 = tmp_path / "run", bf16_checkpoint(tmp_path / "v0"), tmp_path / "v1"
    write_round(run, [1.0, 0.0, 1.0, 0.0])
    cfg = TrainConfig(lr=1e-3, max_tokens_per_microbatch=128, steps_per_round=1, device="cuda")
    m = train_round(run, 0, v0, v1, cfg, origin=v0)
    print({k: m[k] for k in ("device", "seconds", "tokens_per_s", "tflops", "peak_gpu_mib") if k in m})

    assert m["device"].startswith("cuda") and m["bf16"] is True and m["peak_gpu_mib"] > 0
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    assert m["tokens_per_s"] > 0 and m["tflops"] > 0
    peak = peak_bf16_tflops(torch.cuda.get_device_name())
    if peak is not None:
        assert m["peak_tflops_bf16"] == peak and 0 < m["mfu"] < 1

    before = load_file(v0 / "model.safetensors")
    served = load_file(v1 / "model.safetensors")
    master = load_file(master_dir(v1) / "model.safetensors")
    assert {t.dtype for t in served.values()} == {torch.bfloat16}  # what the engines load
    assert {t.dtype for t in master.values()} == {torch.float32}  # what the trainer carries on
    assert any(not torch.equal(master[k], before[k].float()) for k in before)  # the weights moved
    assert m["served_dtype"] == "bfloat16" and m["served_changed"] > 0
    groups = torch.load(optimizer_file(v1), weights_only=True)["param_groups"]
    assert all(g["fused"] for g in groups)  # CUDA's default: AdamW's fused kernel


def node_rows(n: int, length: int, seed: int = 0) -> list[Row]:
    """Node-like rows: a 64-token prompt, then 48-token actions between 32-token observations."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        mask = np.zeros(length, dtype=np.int8)
        for start in range(64, length, 80):
            mask[start : start + 48] = 1
        rows.append(make_row(f"n{i}", rng.integers(3, 500, length), mask, None, float(rng.choice([-1, 1]))))
    return rows


def measured_peak_gib(folder: Path, cfg, rows: list[Row]) -> float:
    """Peak allocated GPU memory of one training step of the stage (weights loaded as it loads them),
    everything freed afterwards (checked: a leak would inflate the next measurement)."""
    gc.collect()
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    model, tok = load_policy(folder, cfg.train)
    torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory(prefix="rao-train-") as work:
        model, metrics = train_rows(model, tok, rows, cfg.train, Path(work))
    peak = torch.cuda.max_memory_allocated()
    assert metrics["peak_gpu_mib"] * 2**20 <= peak and metrics["bf16"]
    print(
        f"fused_adamw={cfg.train.fused_adamw}: {metrics['tflops']:.1f} TFLOP/s, peak {peak / 2**30:.2f} GiB"
    )
    del model, metrics
    gc.collect()
    torch.cuda.empty_cache()
    left = torch.cuda.memory_allocated() - baseline  # cuBLAS's workspaces stay: tens of MiB
    assert left < 2**28, f"the trainer left {left / 2**30:.2f} GiB behind"
    return peak / 2**30


def test_the_memory_plan_against_the_measured_training_peak(tmp_path):
    """The plan's 16 B/param (master, gradients, moments) plus activations, LM head tile and runtime,
    x 1.15, against the allocator's peak. The peak is AdamW's step: foreach AdamW (the plain one)
    allocates two full-size temporaries there, one after the other (4 B/param), the fused kernel
    none; the plan, one formula for both, must be within 10% of the foreach peak and never below
    the fused one."""
    folder = tmp_path / "qwen3-1.7b-shaped"
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    with torch.device("cuda"):  # a CPU init of 1.7B weights takes longer than the whole test
        model = Qwen3ForCausalLM(
            Qwen3Config(**QWEN3_1_7B, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        )
    params = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(folder)  # as models ship
    tok.save_pretrained(folder)
    del model

    rows = node_rows(8, 512)
    peaks, plans = {}, {}
    for fused in (False, True):
        over = ["train.device=cuda", "train.gradient_checkpointing=true", "train.steps_per_round=1"]
        over += [f"train.max_tokens_per_microbatch={BUDGET}", f"train.fused_adamw={str(fused).lower()}"]
        cfg = load_config(overrides=[f"runs_dir={tmp_path}", f"policy.model={folder}", *over])
        found = memory.devices()
        plan = memory.plan(cfg.train, cfg.policy, folder, found)
        plans[fused] = plan.total("train")
        peaks[fused] = measured_peak_gib(folder, cfg, rows)
        print(memory.table(plan, found), f"\nmeasured peak {peaks[fused]:.2f} GiB")

    assert abs(plans[False] - peaks[False]) <= 0.10 * peaks[False], (plans, peaks)
    assert plans[True] >= peaks[True], (plans, peaks)  # an estimate above the need, never below
    assert (peaks[False] - peaks[True]) * 2**30 >= 2.5 * params, (peaks, params)  # fused saves ~4 B/param
