"""Training throughput: the model-FLOP formula against torch's own count, a round's reported
tokens/s and TFLOP/s, and the fused-AdamW choice (rao_core/train/flops.py, trainer.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen3Config, Qwen3ForCausalLM

from rao_core.checkpoints import optimizer_file
from rao_core.layout import METRICS
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.run import Run
from rao_core.stages import report
from rao_core.train.flops import flop_shape, peak_bf16_tflops, throughput, train_flops
from rao_core.train.samples import read_rows
from rao_core.train.stage import train_round
from rao_core.train.trainer import TrainConfig, grpo_args
from tests.train import one_thread, tiny_model  # noqa: F401 (autouse fixture)
from tests.train.test_stage import write_round

LENGTHS = [16, 200]  # at 200 tokens attention is a third of the tiny model's FLOPs: both terms count
TOLERANCE = 1e-3  # exact with torch 2.13 / transformers 5.20; room for a stray small matmul


def counted(model: torch.nn.Module, lengths: list[int], backward: bool = True) -> int:
    """FLOPs torch's FlopCounterMode counts for a forward (+ backward) of each sequence alone.

    Eager attention: its Q K^T and P V are plain matmuls, counted once each way; the CPU's fused
    SDPA kernel is not in the counter's table (it would count no attention at all)."""
    model.set_attn_implementation("eager")
    total = 0
    for s in lengths:
        ids = torch.randint(3, 500, (1, s), generator=torch.Generator().manual_seed(s))
        with FlopCounterMode(display=False) as counter:
            if backward:
                model(input_ids=ids, labels=ids).loss.backward()
            else:
                with torch.no_grad():
                    model(input_ids=ids)
        total += counter.get_total_flops()
    return total


def test_the_formula_is_the_count_of_a_forward_and_backward():
    model = tiny_model()
    shape = flop_shape(model)
    # the LM head counts once (tied to the embedding), the embedding lookup not at all
    linear = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128)
    assert shape.matmul_params == linear + len(tiny_tokenizer()) * 64
    assert (shape.layers, shape.attention_width) == (2, 64)
    attention = 12 * shape.layers * shape.attention_width * sum(s * s for s in LENGTHS)
    assert attention > 0.3 * train_flops(shape, LENGTHS)  # a wrong attention term cannot hide
    assert train_flops(shape, LENGTHS) == pytest.approx(counted(model, LENGTHS), rel=TOLERANCE)
    # per sequence: the sum of s^2, not the padded width (a 16-token row padded to 200 is not counted)
    assert train_flops(shape, LENGTHS) < train_flops(shape, [200, 200])
    # the reference model's forward (train.beta > 0) is one more forward
    extra = train_flops(shape, LENGTHS, reference=True) - train_flops(shape, LENGTHS)
    assert extra == pytest.approx(counted(model, LENGTHS, backward=False), rel=TOLERANCE)


def test_frozen_weights_skip_their_gradients():
    """LoRA's base: every weight matrix frozen, the activations' gradients still flow (to the
    embedding here, to the adapters in a peft model): 4 N s instead of 6 N s."""
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
        )
    )  # fmt: skip
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight.requires_grad_(False)
    shape = flop_shape(model)
    assert train_flops(shape, LENGTHS, frozen=True) == pytest.approx(counted(model, LENGTHS), rel=TOLERANCE)
    assert train_flops(shape, LENGTHS, frozen=True) < train_flops(shape, LENGTHS)


def test_peak_table_and_mfu():
    assert peak_bf16_tflops("NVIDIA H200") == peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989
    assert peak_bf16_tflops("NVIDIA H100 PCIe") == 756 and peak_bf16_tflops("NVIDIA GH200 480GB") == 989
    assert peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312 and peak_bf16_tflops("NVIDIA L40S") == 362
    assert peak_bf16_tflops("NVIDIA L40") == 181 and peak_bf16_tflops("NVIDIA L4") == 121
    assert peak_bf16_tflops("NVIDIA A10") == 125
    assert peak_bf16_tflops("NVIDIA A10G") is None and peak_bf16_tflops("Tesla V100-SXM2-16GB") is None
    cpu = throughput(3e12, 2.0, torch.device("cpu"))
    assert cpu == {"model_flops": 3e12, "tflops": 1.5}  # no peak, no MFU off a GPU


def test_fused_adamw_is_cuda_only(tmp_path):
    assert grpo_args(TrainConfig(device="cpu"), tmp_path, 1, 8).optim == "adamw_torch"
    # bf16 off: TrainingArguments refuses bf16 on a machine without a GPU, the choice is the same
    assert grpo_args(TrainConfig(device="cuda", bf16=False), tmp_path, 1, 8).optim == "adamw_torch_fused"
    on_cpu = TrainConfig(device="cpu", fused_adamw=True)
    assert grpo_args(on_cpu, tmp_path, 1, 8).optim == "adamw_torch_fused"  # asked for: the setting wins
    off = TrainConfig(device="cuda", bf16=False, fused_adamw=False)
    assert grpo_args(off, tmp_path, 1, 8).optim == "adamw_torch"


def test_a_round_reports_tokens_per_s_and_tflops(tmp_path):
    """The stage's metrics.json, the round's log line; on the CPU the optimizer is the plain AdamW."""
    from rao_core.run import load_config

    v0 = tmp_path / "v0"
    tiny_model(seed=3).save_pretrained(v0)
    tiny_tokenizer().save_pretrained(v0)
    cfg = load_config(overrides=[f"runs_dir={tmp_path / 'runs'}", "run_name=r", f"policy.model={v0}"])
    write_round(cfg.run_dir, [1.0, 0.0, 1.0, 0.0])
    out = Path(cfg.layout.checkpoint(1))
    train = TrainConfig(lr=1e-3, max_tokens_per_microbatch=128, steps_per_round=1)
    metrics = train_round(cfg.run_dir, 0, v0, out, train)

    saved = json.loads((out / METRICS).read_text())
    rows = read_rows(cfg.run_dir, 0)
    assert saved["tokens"] == sum(r.length for r in rows) and saved["tokens_per_s"] > 0
    assert saved["model_flops"] == train_flops(flop_shape(tiny_model()), [r.length for r in rows])
    assert (
        saved["tflops"] == pytest.approx(saved["model_flops"] / saved["seconds"] / 1e12)
        and saved["tflops"] > 0
    )
    assert saved["padded_tokens"] >= saved["tokens"]
    assert "mfu" not in saved and "peak_tflops_bf16" not in saved  # a CPU has no entry in the table
    assert saved["config"]["fused_adamw"] is None and saved["loss"] == metrics["loss"]
    groups = torch.load(optimizer_file(out), weights_only=True)["param_groups"]
    assert not any(g.get("fused") for g in groups)  # the CPU round's AdamW is the plain one

    line = report.train_line(Run(cfg), 0)
    assert f"{saved['tokens_per_s']:,.0f} tokens/s, {saved['tflops']:.3g} TFLOP/s" in line
    assert "MFU" not in line
