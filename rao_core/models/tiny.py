"""The bootstrap policy: a tiny Qwen3 built from a config, and local checkpoints.

Nothing can be downloaded, so the default model is built in-process from a seed: a Qwen3 of a
few hundred thousand to a few million parameters on the locally trained tokenizer. Qwen3 is a
stock architecture that transformers, TRL and vLLM all load; its head_dim is kept >= 32 because
vLLM's attention kernels refuse smaller heads. Checkpoints are plain `save_pretrained` folders
written atomically, so a reader (an engine reloading weights) never sees half a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rao_core.models.loading import load_causal_lm
from rao_core.models.tokenizer import tiny_tokenizer

MODELS_DIR = Path("runs/_models")


def tiny_config(
    tokenizer: PreTrainedTokenizerBase,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 384,
    max_positions: int = 4096,
) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=max(32, hidden // heads),  # vLLM needs >= 32
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, seed: int = 0, **kw) -> Qwen3ForCausalLM:
    """A freshly initialised model; the same seed and config give the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(tiny_config(tokenizer, **kw))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def save_checkpoint(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path, replace: bool = True
) -> Path:
    """Write model and tokenizer to a temporary sibling folder, then rename it into place. With
    `replace=False` a folder that appeared meanwhile (another process built the same one) wins."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not replace:
        try:
            os.rename(tmp, path)
        except OSError:  # it exists now, and is the same checkpoint
            shutil.rmtree(tmp, ignore_errors=True)
        return path
    old = None
    if path.exists():  # rename() cannot replace a non-empty folder: move the old one aside first
        old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(path, old)
    os.rename(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(
    dtype: str | torch.dtype = "auto", device: torch.device | str = "cpu", folder: str | Path | None = None
) -> torch.dtype:
    """'auto' is bfloat16 on a GPU; on a CPU the checkpoint's own dtype where the CPU has bf16
    matrix units, else float32 (rao_core/models/dtypes.py)."""
    from rao_core.models.dtypes import auto_dtype

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return getattr(torch, auto_dtype(torch.device(device).type, folder))
    return getattr(torch, dtype)


def load_checkpoint(
    path: str | Path, device: str = "auto", dtype: str | torch.dtype = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (eval mode, on `device`) and tokenizer from a local folder; never downloads."""
    dev = resolve_device(device)
    model = load_causal_lm(path, dtype=resolve_dtype(dtype, dev, path))
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return model.to(dev).eval(), tokenizer


def config_hash(config: Qwen3Config, tokenizer: PreTrainedTokenizerBase, seed: int) -> str:
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    text = f"{config.to_json_string(use_diff=False)}|{vocab}|{seed}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def resolve_model(name: str, models_dir: str | Path = MODELS_DIR) -> Path:
    """'tiny': the seed-0 bootstrap checkpoint, built and cached on first use; else a local folder."""
    if name == "tiny":
        tok = tiny_tokenizer()
        path = Path(models_dir) / f"tiny-{config_hash(tiny_config(tok), tok, 0)}"
        if not path.exists():
            save_checkpoint(build_tiny_model(tok, seed=0), tok, path, replace=False)
        return path
    path = Path(name)
    if not path.is_dir():
        raise FileNotFoundError(f"model {name!r}: not 'tiny' and no local folder of that name")
    return path
