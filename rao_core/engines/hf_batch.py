"""The batching engine's data structures: one left-padded KV cache for the running rows, and the
K/V of finished conversations kept for their next turn (docs/engines.md, HFEngine).

They rely on transformers internals (the DynamicLayer that a cache is made of, the attention and
mask registries), checked against the exact version they were written for: an upgrade must pass
tests/engines/test_hf_engine.py, which compares every path with model.generate and a full forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rao_core.versions import require_tested

require_tested(
    "transformers", "5.20.2", "rao_core.engines.hf (its KV cache)", "tests/engines/test_hf_engine.py"
)


def completes_stop(ids: Sequence[int], decode: Callable[[list[int]], str], stops: Sequence[str]) -> bool:
    """Does the text of `ids` contain a stop string near its end? Decodes only a tail window long
    enough for the longest stop (every token holds at least one byte), so a per-step check costs
    O(1); callers check after every token, so the first hit is at the completing token."""
    if not stops or not ids:
        return False
    window = max(len(s.encode()) for s in stops) + 1
    tail = decode(list(ids[-window:]))
    return any(s in tail for s in stops)


def stop_index(ids: Sequence[int], decode: Callable[[list[int]], str], stops: Sequence[str]) -> int | None:
    """Tokens to keep: up to and including the token that completes the first stop string, or
    None if the decoded text never contains one."""
    for k in range(1, len(ids) + 1):
        if completes_stop(ids[:k], decode, stops):
            return k
    return None


def sdpa_gqa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    """SDPA with grouped K/V heads kept grouped (`enable_gqa`) even under a padding mask."""
    causal = attention_mask is None and query.shape[2] > 1  # transformers drops the mask only if kv == q
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("sdpa_gqa", sdpa_gqa)
AttentionMaskInterface.register("sdpa_gqa", sdpa_mask)


class GrowLayer(DynamicLayer):
    """A DynamicLayer that writes new K/V into spare columns: DynamicLayer concatenates, a copy of
    the whole cache every decode step (as costly as the attention itself on a CPU)."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.set(key_states, value_states)
            return self.keys, self.values
        n, m = self.keys.shape[-2], key_states.shape[-2]
        if n + m > self._k.shape[-2]:
            self.set(self.keys, self.values, room=m)
        self._k[:, :, n : n + m], self._v[:, :, n : n + m] = key_states, value_states
        self.keys, self.values = self._k[:, :, : n + m], self._v[:, :, : n + m]
        return self.keys, self.values

    def set(self, keys: torch.Tensor, values: torch.Tensor, room: int = 0) -> None:
        """Adopt (batch, heads, n, dim) K/V, with spare columns to grow into."""
        b, h, n, d = keys.shape
        self._k = keys.new_empty((b, h, n + room + max(64, n // 4), d))
        self._v = torch.empty_like(self._k)
        self._k[:, :, :n], self._v[:, :, :n] = keys, values
        self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True


def new_cache(config) -> DynamicCache:
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise NotImplementedError("HFEngine merges KV caches: it needs full-attention layers only")
    cache.layers = [GrowLayer() for _ in cache.layers]
    return cache


class Batch:
    """The running rows: a left-padded KV cache, its attention mask, next positions, last tokens."""

    def __init__(self) -> None:
        self.seqs: list = []  # the engine's requests, one per row
        self.cache: DynamicCache | None = None
        self.mask = self.pos = self.last = torch.empty(0)

    def select(self, keep: list[int]) -> None:
        """Keep only rows `keep`, then drop leading cache columns that no remaining row attends to."""
        if len(keep) == len(self.seqs):
            return  # nothing left the batch: no copy
        self.seqs = [self.seqs[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, torch.empty(0)
            return
        idx = torch.tensor(keep, device=self.mask.device)
        self.mask, self.pos, self.last = self.mask[idx], self.pos[idx], self.last[idx]
        first = int(self.mask.any(0).int().argmax())
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.set(layer.keys[idx, :, first:], layer.values[idx, :, first:])

    def extend(self, other: Batch) -> None:
        """Append `other`'s rows; the shorter cache is left-padded with masked zeros."""
        if not self.seqs:
            self.__dict__.update(other.__dict__)
            return
        n = max(self.mask.shape[1], other.mask.shape[1])

        def pad(x: torch.Tensor, dim_from_end: int) -> torch.Tensor:
            return F.pad(x, (0, 0) * (dim_from_end - 1) + (n - x.shape[-dim_from_end], 0))

        for a, b in zip(self.cache.layers, other.cache.layers, strict=True):
            a.set(
                torch.cat([pad(a.keys, 2), pad(b.keys, 2)]), torch.cat([pad(a.values, 2), pad(b.values, 2)])
            )
        self.mask = torch.cat([pad(self.mask, 1), pad(other.mask, 1)])
        self.pos, self.last = torch.cat([self.pos, other.pos]), torch.cat([self.last, other.last])
        self.seqs += other.seqs

    def row_kv(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row i's K/V per layer at its real (unmasked) positions, as (kv_heads, n, head_dim)."""
        cols = self.mask[i].nonzero().squeeze(1)
        return [(layer.keys[i][:, cols], layer.values[i][:, cols]) for layer in self.cache.layers]


class Prefixes:
    """K/V of finished rows with the tokens they cover, oldest dropped past `max_tokens` tokens.

    A prompt that extends a stored conversation takes it whole (it is removed: conversations only
    grow); otherwise the longest shared beginning of at least `min_shared` tokens (the system
    prompt every node shares) is copied out and the entry stays."""

    def __init__(self, max_tokens: int, min_shared: int = 32) -> None:
        self.max_tokens, self.min_shared, self.tokens, self.count = max_tokens, min_shared, 0, 0
        self.entries: dict[int, tuple[torch.Tensor, list]] = {}  # insertion-ordered: oldest first

    def put(self, ids: list[int], kv: list) -> None:
        if not ids or len(ids) > self.max_tokens:
            return
        self.entries[self.count] = (torch.tensor(ids), kv)
        self.tokens, self.count = self.tokens + len(ids), self.count + 1
        while self.tokens > self.max_tokens:
            self.tokens -= len(self.entries.pop(next(iter(self.entries)))[0])

    def take(self, prompt: list[int]) -> tuple[int, list] | None:
        """(n, K/V of prompt[:n]) with n < len(prompt), or None."""
        p, best, best_n = torch.tensor(prompt), None, 0
        for key, (ids, _) in self.entries.items():
            m = min(len(ids), len(p) - 1)
            if m <= best_n:
                continue
            same = ids[:m] == p[:m]
            n = m if bool(same.all()) else int(same.int().argmin())
            if n > best_n:
                best, best_n = key, n
        if best is None:
            return None
        ids, kv = self.entries[best]
        if best_n == len(ids):
            del self.entries[best]
            self.tokens -= best_n
            return best_n, kv
        if best_n < self.min_shared:
            return None
        return best_n, [(k[:, :best_n], v[:, :best_n]) for k, v in kv]

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0
