"""Will the run fit? The memory each stage needs, estimated from the model's files, against the
devices found, before any work (`rao train --check`, `rao doctor`, and every `rao train`).

Nothing here imports torch: the model is read from its config.json and its safetensors headers,
GPUs from `nvidia-smi`, host memory from /proc/meminfo. The figures are estimates (the formulas are
below, and docs/scale-out.md compares them with measurements); a plan is refused only when the
estimate is above the device's memory, and RAO_SKIP_MEMORY_CHECK=1 runs it anyway.

    trainer, full fine-tuning: float32 master weights, gradients and AdamW moments = 16 B/param,
        plus activations: with gradient checkpointing each layer keeps its input (T x H) and one
        layer is recomputed at a time; without, every layer keeps ~(12 H + 3 I) values per token,
        plus TRL's fused LM head tile (4,096 tokens x 32,768 vocabulary entries, float32), plus
        1 GiB for the libraries themselves; 15% headroom on top (calibrated on Qwen3-0.6B's shapes:
        docs/scale-out.md)
    trainer, LoRA: the frozen base in its dtype, the adapter with its gradients and moments
    vLLM: its share of the GPU (policy.gpu_memory_utilization), unless it sleeps or stops while the
        trainer runs (policy.vllm_during_train); on a CPU the weights plus its KV cache
    transformers engine: the weights in the serving dtype plus, on a CUDA device with the static
        decode path, its fixed K/V slots (policy.max_batch_size rows, the columns kv_budget.py gives
        them from the memory the weights leave, at most the model's context) and its prefix store;
        else K/V for policy.max_batch_tokens (slots that grow as rows need)
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rao_core.config import ConfigError, PolicyConfig, TrainConfig
from rao_core.config.types import device_type
from rao_core.engines import kv_budget

GIB = 2**30
BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "F8_E4M3": 1}
HEADROOM = 1.15  # allocator fragmentation and buffers the formulas leave out
RUNTIME = 1.0  # GiB: torch, transformers and TRL themselves in the trainer's process


@dataclass
class ModelShape:
    params: int
    dtype_bytes: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_dim: int  # key/value heads x head_dim
    max_positions: int = 1 << 20  # the model's context (max_position_embeddings)


def read_shape(folder: Path) -> ModelShape:
    """Parameter count and dtype from the safetensors headers (no weights read), shapes from config.json."""
    params, bytes_ = 0, 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                params += count
                bytes_ += count * BYTES.get(t["dtype"], 2)
    c = json.loads((Path(folder) / "config.json").read_text())
    c = c.get("text_config", c)  # multimodal configs nest the language model's
    heads = c.get("num_attention_heads", 1)
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    return ModelShape(
        params=params,
        dtype_bytes=round(bytes_ / max(params, 1)),
        layers=c["num_hidden_layers"],
        hidden=c["hidden_size"],
        intermediate=c.get("intermediate_size", 4 * c["hidden_size"]),
        vocab=c["vocab_size"],
        kv_dim=c.get("num_key_value_heads", heads) * head_dim,
        max_positions=c.get("max_position_embeddings") or 1 << 20,
    )


@dataclass
class Device:
    name: str
    gib: float


def devices() -> dict[str, Device]:
    """'cuda' (the first GPU) when nvidia-smi sees one, and 'cpu' (host memory)."""
    found = {}
    total = next((int(x.split()[1]) for x in _meminfo() if x.startswith("MemTotal:")), 0)
    found["cpu"] = Device("host memory", total / 2**20)
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            name, mib = out.stdout.strip().splitlines()[0].rsplit(",", 1)
            found["cuda"] = Device(name.strip(), int(mib) / 1024)
    return found


def _meminfo() -> list[str]:
    try:
        return Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return []


@dataclass
class Plan:
    model: str
    shape: ModelShape
    stages: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> part -> GiB
    device: dict[str, str] = field(default_factory=dict)  # stage -> device key
    resident: dict[str, float] = field(default_factory=dict)  # stage -> GiB others hold meanwhile
    refused: dict[str, str] = field(default_factory=dict)  # stage -> why it cannot run, whatever fits

    def total(self, stage: str) -> float:
        return sum(self.stages[stage].values()) * HEADROOM


def plan(train: TrainConfig, policy: PolicyConfig, folder: Path, found: dict[str, Device]) -> Plan:
    """The estimate of every stage (training with `train`, sampling with `policy`) with the model
    in `folder` (policy version 0)."""
    from rao_core.engines.vllm_args import during_train  # torch-free

    s, t, p = read_shape(folder), train, policy
    gpu = "cuda" in found
    train_dev = device_type(t.device) if t.device != "auto" else ("cuda" if gpu else "cpu")
    device = getattr(p, "device", "auto")  # the model engines' setting (hf, vllm)
    engine_dev = device_type(device) if device != "auto" else ("cuda" if gpu else "cpu")
    out = Plan(str(folder), s)
    shards = _shards(t.accelerate_config)
    tokens = t.max_tokens_per_microbatch
    act_bytes = 2 if (t.bf16 or (t.bf16 is None and train_dev == "cuda")) else 4
    if t.gradient_checkpointing:
        acts = (s.layers * tokens * s.hidden + tokens * (12 * s.hidden + 3 * s.intermediate)) * act_bytes
    else:
        acts = s.layers * tokens * (12 * s.hidden + 3 * s.intermediate) * act_bytes
    head = min(tokens, 4096) * min(s.vocab, 32768) * 4 * 2
    if t.lora:
        adapter = 2 * t.lora_r * (s.hidden + s.intermediate) * 3 * s.layers  # about the targets' shapes
        train = {"frozen base": s.params * s.dtype_bytes, "adapter + grads + AdamW": adapter * 16}
    else:
        train = {
            "master weights (fp32)": 4 * s.params / shards,
            "gradients": 4 * s.params / shards,
            "AdamW moments": 8 * s.params / shards,
        }
    train.update({"activations": acts, "LM head tile": head, "runtime": RUNTIME * GIB})
    out.stages["train"] = {k: v / GIB for k, v in train.items()}
    out.device["train"] = train_dev
    if p.kind == "vllm":
        if engine_dev == "cuda" and gpu:
            engine = {"vLLM share of the GPU": p.gpu_memory_utilization * found["cuda"].gib * GIB}
        else:
            engine = {"weights": s.params * 4, "KV cache": p.vllm_kv_cache_gib * GIB}
        keeps = during_train(p) == "keep"
    elif p.kind == "hf":
        width = 2 if engine_dev == "cuda" else 4
        col = kv_budget.column_bytes(s.layers, s.kv_dim, width)  # one token of one row
        engine = {"weights": s.params * width}
        if (
            engine_dev == "cuda" and gpu and p.decode in ("auto", "static")
        ):  # fixed slots, as the engine sizes them (it also caps the columns at the agent's context)
            rows, free = p.max_batch_size, found["cuda"].gib * GIB - engine["weights"]
            cols = kv_budget.slot_columns(free, rows, col, s.max_positions, kv_budget.PREFIX_TOKENS)
            engine[f"K/V slots ({rows} rows x {max(cols, 0):,} columns)"] = rows * (max(cols, 0) + 1) * col
            engine["prefix store"] = kv_budget.PREFIX_TOKENS * col
            why = kv_budget.refusal(rows, cols, free / GIB)
            if why:
                out.refused["rollout"] = why
        else:
            engine["KV cache"] = p.max_batch_tokens * col
        keeps = False  # the engine of a stage is gone when the stage ends
    else:
        engine, keeps = {}, False
    if engine:
        out.stages["rollout"] = {k: v / GIB for k, v in engine.items()}
        out.device["rollout"] = engine_dev
        if keeps and engine_dev == train_dev:
            out.resident["train"] = sum(out.stages["rollout"].values())
    return out


def _shards(accelerate_config: str) -> int:
    """How many processes share the training state (FSDP / ZeRO-3 shard it; DDP copies it)."""
    if not accelerate_config or not Path(accelerate_config).is_file():
        return 1
    import yaml

    conf = yaml.safe_load(Path(accelerate_config).read_text()) or {}
    sharded = conf.get("distributed_type") in ("FSDP", "DEEPSPEED")
    return int(conf.get("num_processes", 1)) if sharded else 1


def table(pl: Plan, found: dict[str, Device]) -> str:
    lines = [f"memory plan for {pl.model} ({pl.shape.params / 1e9:.3f}B parameters, an estimate):"]
    for stage, parts in pl.stages.items():
        dev = found.get(pl.device[stage])
        cap = f"{dev.gib:.1f} GiB {dev.name}" if dev else f"{pl.device[stage]} (not found)"
        held = pl.resident.get(stage, 0.0)
        beside = f" + {held:.1f} GiB vLLM keeps" if held else ""
        detail = ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
        lines.append(f"  {stage:8s} {pl.total(stage):7.2f} GiB{beside} of {cap}: {detail}")
    return "\n".join(lines)


def check(policy: PolicyConfig, train: TrainConfig) -> str | None:
    """The plan's table, or None when there is no model to read yet ('tiny', 'warmstart', a
    scripted policy); raises ConfigError when a stage cannot fit."""
    from rao_core.models.locate import is_shipped, local_model, model_exists

    name = policy.model
    if policy.kind == "scripted" or name in ("tiny", "warmstart") or is_shipped(name):
        return None  # the tiny model: nothing to estimate
    if not model_exists(name):
        return None  # said elsewhere (config checks, doctor)
    found = devices()
    pl = plan(train, policy, local_model(name), found)
    for stage, why in pl.refused.items():
        raise ConfigError(f"memory: the {stage} stage's {why} (RAO_SKIP_MEMORY_CHECK=1 runs it anyway)")
    for stage in pl.stages:
        dev = found.get(pl.device[stage])
        need = pl.total(stage) + pl.resident.get(stage, 0.0)
        if dev is not None and need > dev.gib and not os.environ.get("RAO_SKIP_MEMORY_CHECK"):
            raise ConfigError(
                f"memory: the {stage} stage needs about {need:.1f} GiB on {pl.device[stage]} but it has "
                f"{dev.gib:.1f} GiB ({table(pl, found).splitlines()[[*pl.stages].index(stage) + 1].strip()}); "
                "try train.lora=true, train.gradient_checkpointing=true, a smaller "
                "train.max_tokens_per_microbatch or policy.vllm_during_train=sleep (RAO_SKIP_MEMORY_CHECK=1 runs it anyway)"
            )
    return table(pl, found)
