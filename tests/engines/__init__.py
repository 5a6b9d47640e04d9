"""Helpers shared by the engine tests: small models built in-process and request shorthands."""

from __future__ import annotations

import torch

from rao_core.models.tiny import build_tiny_model
from rao_core.policy import GenerationRequest

CHAIN_TEXT = "ok</python> tailwords"  # every token distinct, so "next token" is a function


def small_model(tok, seed: int = 0):
    """Architecture is irrelevant to the engine tests: hidden 64, 2 layers (head_dim 32)."""
    return build_tiny_model(tok, seed=seed, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128)


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
