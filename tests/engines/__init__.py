"""Helpers shared by the engine tests: small models built in-process and request shorthands."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rao_core.models.tiny import build_tiny_model
from rao_core.policy import GenerationRequest

CHAIN_TEXT = "ok</python> tailwords"  # every token distinct, so "next token" is a function


def small_model(tok, seed: int = 0):
    """Architecture is irrelevant to the engine tests: hidden 64, 2 layers (head_dim 32)."""
    return build_tiny_model(tok, seed=seed, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128)


def gqa_model(tok, kv_heads: int, seed: int = 0):
    """Grouped-query heads as the real models have them: 16 query heads over `kv_heads` K/V heads
    (Qwen3-0.6B: 8; the shipped tiny models: 4 over 2), head_dim 32, 2 layers."""
    return build_tiny_model(
        tok, seed=seed, hidden=64, layers=2, heads=16, kv_heads=kv_heads, intermediate=128
    )


class ReplayedGraphs:
    """A CPU stand-in for hf_static.CUDAGraphs (CUDA graphs do not run here), so that the static
    path's capture and replay logic runs in the CPU suite: `record` returns a replay that runs the
    step again into the same output tensors (a graph replay overwrites its outputs), and checks that
    the engine's K/V slots are still the allocation it was recorded against (a graph reads fixed
    addresses). `replay_error` / `record_error`: what the next replay or record raises."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.recorded: list[tuple[int, int]] = []  # (rows, columns) of each recording
        self.replays = 0
        self.replay_error: BaseException | None = None
        self.record_error: BaseException | None = None

    def warm_up(self, fn) -> None:
        fn()

    def record(self, fn):
        if self.record_error is not None:
            raise self.record_error
        slots = self.engine._slots
        address = slots.kv.data_ptr()
        out = fn()
        self.recorded.append((out[0].shape[0], slots._length))

        def replay() -> None:
            if self.replay_error is not None:
                raise self.replay_error
            assert self.engine._slots.kv.data_ptr() == address, "a graph replayed over freed K/V slots"
            self.replays += 1
            for dst, src in zip(out, fn(), strict=True):
                dst.copy_(src)

        return replay, out


def chain_model(tok, text: str = CHAIN_TEXT):
    """A model that deterministically continues `text`: attention and MLP outputs are zeroed, so the
    last hidden state is the current token's embedding, and the untied head maps token i of `text`
    to token i+1 with a margin of hundreds of logits (greedy and T=0.7 sampling agree)."""
    ids = tok.encode(text)
    assert len(set(ids)) == len(ids)
    model = small_model(tok)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        head = torch.zeros_like(emb)
        for a, b in zip(ids, ids[1:], strict=False):
            head[b] = emb[a] / emb[a].norm() * 50
    model.lm_head.weight = torch.nn.Parameter(head)
    model.config.tie_word_embeddings = False
    return model, ids


def req(prompt_ids, max_new_tokens: int = 16, temperature: float = 0.0, stop=()) -> GenerationRequest:
    return GenerationRequest(list(prompt_ids), max_new_tokens, tuple(stop), None, temperature)  # type: ignore[arg-type]


SDPA = F.scaled_dot_product_attention


def record_sdpa(monkeypatch, transposed: bool = False) -> list[dict]:
    """Wrap SDPA to record every call (its tensors and arguments); with `transposed`, its output
    comes back in the memory-efficient kernel's layout: (b, heads, t, d) values stored as (b, t,
    heads, d), as CUDA returns them (issue 51, item 1)."""
    calls: list[dict] = []

    def recording(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        calls.append(
            dict(q=query, k=key, v=value, mask=attn_mask, dropout=dropout_p, causal=is_causal, gqa=enable_gqa)
        )
        out = SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2).contiguous().transpose(1, 2) if transposed else out

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


def efficient_refusals(call: dict) -> list[str]:
    """Why CUDA's memory-efficient kernel would refuse a recorded SDPA call: the dense-input
    constraints of torch's can_use_mem_efficient_attention (aten/src/ATen/native/transformers/cuda/
    sdp_utils.cpp), at their strictest across the torch releases the project runs on (2.11 to
    2.13): grouped heads and `enable_gqa` refused, an sm80 GPU's alignment in half precision.
    (torch's CPU build cannot evaluate its own rules: the gpu tier asks torch, test_hf_cuda.py.)"""
    q, k, v, mask = call["q"], call["k"], call["v"], call["mask"]
    align = 8 if q.dtype in (torch.float16, torch.bfloat16) else 4
    why = []
    if not all(t.dim() == 4 for t in (q, k, v)):
        why.append("query, key and value must be 4-D")
    elif not (q.shape[0] == k.shape[0] == v.shape[0] and q.shape[1] == k.shape[1] == v.shape[1]):
        why.append(f"batch and heads must match: {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)}")
    if call["gqa"]:
        why.append("enable_gqa")
    if q.shape[-1] != k.shape[-1] or q.shape[-1] % align or v.shape[-1] % align:
        why.append(f"head_dim {q.shape[-1]} not a multiple of {align}")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        why.append("last dimension not contiguous")
    if any(t.storage_offset() % align for t in (q, k, v)):
        why.append("storage offset not aligned")
    if 0 in (q.shape[2], k.shape[2]):
        why.append("an empty sequence")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype:
        why.append(f"dtype {q.dtype}")
    if mask is not None and (mask.dtype not in (torch.bool, q.dtype) or mask.stride(-1) != 1):
        why.append("mask neither boolean nor of the query's dtype, or not contiguous in its last dimension")
    return why
