"""The memory plan: estimates read from a model's files, refusals that print the numbers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from rao_core import memory
from rao_core.config import ConfigError
from rao_core.run import load_config

QWEN3_0_6B = dict(vocab=151936, hidden=1024, inter=3072, layers=28, heads=16, kv=8, head_dim=128)
QWEN3_4B = dict(vocab=151936, hidden=2560, inter=9728, layers=36, heads=32, kv=8, head_dim=128)


def shaped_model(path: Path, vocab, hidden, inter, layers, heads, kv, head_dim) -> Path:
    """config.json and a bf16 safetensors header with a Qwen3's tensor shapes (no weights: the
    plan reads headers only)."""
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": [heads * head_dim, hidden],
            p + "self_attn.k_proj.weight": [kv * head_dim, hidden],
            p + "self_attn.v_proj.weight": [kv * head_dim, hidden],
            p + "self_attn.o_proj.weight": [hidden, heads * head_dim],
            p + "self_attn.q_norm.weight": [head_dim],
            p + "self_attn.k_norm.weight": [head_dim],
            p + "mlp.gate_proj.weight": [inter, hidden],
            p + "mlp.up_proj.weight": [inter, hidden],
            p + "mlp.down_proj.weight": [hidden, inter],
            p + "input_layernorm.weight": [hidden],
            p + "post_attention_layernorm.weight": [hidden],
        }
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    path.mkdir(parents=True)
    raw = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    config = {
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": head_dim, "tie_word_embeddings": True, "dtype": "bfloat16",
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return path


H100 = {"cuda": memory.Device("NVIDIA H100 80GB HBM3", 79.6), "cpu": memory.Device("host memory", 500.0)}


def gpu_config(tmp_path, model: Path, *overrides: str):
    return load_config(
        overrides=[f"runs_dir={tmp_path}", f"policy.model={model}", "policy.device=cuda", "train.device=cuda",
                   "train.gradient_checkpointing=true", "train.max_tokens_per_microbatch=16384",
                   "policy.gpu_memory_utilization=0.5", *overrides],
        check_files=False,
    )  # fmt: skip


def test_the_shape_is_read_from_the_files(tmp_path):
    shape = memory.read_shape(shaped_model(tmp_path / "m", **QWEN3_0_6B))
    assert shape.params == pytest.approx(0.596e9, rel=0.005) and shape.dtype_bytes == 2
    assert (shape.layers, shape.hidden, shape.vocab, shape.kv_dim) == (28, 1024, 151936, 1024)


def test_a_4b_model_on_one_80gb_gpu(tmp_path, monkeypatch):
    """Full fine-tuning (16 B/param) fits only if vLLM leaves the GPU while the trainer runs; LoRA
    fits beside it."""
    monkeypatch.setattr(memory, "devices", lambda: H100)
    model = shaped_model(tmp_path / "4b", **QWEN3_4B)

    def check(cfg):
        return memory.check(cfg.policy, cfg.train)

    asleep = check(gpu_config(tmp_path, model, "policy.kind=vllm", "policy.vllm_during_train=sleep"))
    assert "train" in asleep and "master weights (fp32) 14.9" in asleep
    with pytest.raises(ConfigError) as err:
        check(gpu_config(tmp_path, model, "policy.kind=vllm", "policy.vllm_during_train=keep"))
    msg = str(err.value)
    assert msg.startswith("memory: the train stage needs about") and "of 79.6 GiB" in msg and "\n" not in msg
    assert "train.lora=true" in msg
    lora = check(
        gpu_config(tmp_path, model, "policy.kind=vllm", "policy.vllm_during_train=keep", "train.lora=true")
    )
    assert "vLLM keeps" in lora
    monkeypatch.setenv("RAO_SKIP_MEMORY_CHECK", "1")
    assert check(gpu_config(tmp_path, model, "policy.kind=vllm", "policy.vllm_during_train=keep"))


def test_check_prints_the_plan_and_refuses_what_cannot_fit(tmp_path, monkeypatch, capsys):
    from flows.cli import main

    small = shaped_model(tmp_path / "0.6b", **QWEN3_0_6B)
    monkeypatch.setattr(memory, "devices", lambda: {"cpu": memory.Device("host memory", 24.0)})
    args = ["train", "--check", "--set", f"runs_dir={tmp_path}", "--set", f"policy.model={small}"]
    args += ["--set", "train.gradient_checkpointing=true", "--set", "train.max_tokens_per_microbatch=2048"]
    assert main(args) == 0
    assert "memory plan for" in capsys.readouterr().err
    monkeypatch.setattr(memory, "devices", lambda: {"cpu": memory.Device("host memory", 4.0)})
    assert main(args) == 2
    assert "memory: the train stage needs about" in capsys.readouterr().err


def test_the_plan_counts_the_fixed_k_v_slots_of_the_transformers_engine_on_a_gpu(tmp_path, monkeypatch):
    """Issue 51, item 4: on CUDA the static path's slots are max_batch_size rows of the columns the
    memory gives them (kv_budget.py, the engine's own sizing), beside the weights and the prefix
    store; rows the memory cannot give 256 columns are refused in one line."""
    from rao_core.engines import kv_budget

    monkeypatch.setattr(memory, "devices", lambda: H100)
    model = shaped_model(tmp_path / "0.6b", **QWEN3_0_6B)

    def hf(*overrides: str):
        cfg = load_config(
            overrides=[f"runs_dir={tmp_path}", f"policy.model={model}", "policy.kind=hf", "policy.device=cuda",
                       "train.device=cuda", "train.gradient_checkpointing=true", *overrides],
            check_files=False,
        )  # fmt: skip
        return cfg, memory.plan(cfg.train, cfg.policy, model, H100)

    cfg, pl = hf("policy.max_batch_size=128")
    col = 28 * 2 * 1024 * 2  # layers x (K, V) x kv_dim x bf16: 112 KiB a token
    weights = pl.shape.params * 2
    cols = kv_budget.slot_columns(79.6 * memory.GIB - weights, 128, col, 40960, kv_budget.PREFIX_TOKENS)
    assert cols == 2931  # (0.6 x 78.5 GiB - 7 GiB of prefix store) / (128 x 112 KiB) - 1
    parts = pl.stages["rollout"]
    assert parts[f"K/V slots (128 rows x {cols:,} columns)"] == pytest.approx(
        128 * (cols + 1) * col / memory.GIB
    )
    assert parts["prefix store"] == pytest.approx(7.0) and "KV cache" not in parts
    assert f"K/V slots (128 rows x {cols:,} columns)" in memory.check(cfg.policy, cfg.train)
    assert "KV cache" in hf("policy.decode=runs")[1].stages["rollout"]  # growing slots: as before
    cfg, pl = hf("policy.max_batch_size=16384")
    assert "fewer than 256" in pl.refused["rollout"]
    with pytest.raises(
        ConfigError, match=r"^memory: the rollout stage's K/V slots of 16384 rows get \d+ columns"
    ):
        memory.check(cfg.policy, cfg.train)
