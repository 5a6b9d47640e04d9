"""How many K/V columns the static decode path's slots hold (docs/engines.md, "K/V slots on a GPU").

On a GPU the slots are allocated once, rows x columns for every layer, so that captured CUDA graphs
stay valid for the whole engine's life and nothing grows into an out-of-memory error mid-round.
The engine sizes them from the memory free on its device once the weights are loaded; the memory
plan (`rao train --check`, rao_core/memory.py) from the device's memory less the weights, with
this same function. Torch-free, so the plan imports no torch.
"""

from __future__ import annotations

# The slots' share of the device memory free after the weights: the rest holds the prefix store
# (counted apart), a prefill's activations and mask, the sampler's float64 rows, the CUDA graphs'
# memory pool and the allocator's slack.
KV_SHARE = 0.6
MIN_COLUMNS = 256  # fewer: the rows could not hold a system prompt and a turn; refused
PREFIX_TOKENS = 65536  # the engine's store of finished conversations' K/V (HFEngine.prefix_cache_tokens)


def column_bytes(layers: int, kv_dim: int, dtype_bytes: int) -> int:
    """K and V of one token of one row, over every layer (kv_dim: K/V heads x head_dim)."""
    return layers * 2 * kv_dim * dtype_bytes


def slot_columns(free_bytes: float, rows: int, col_bytes: int, context: int, prefix_tokens: int = 0) -> int:
    """Columns per row of K/V slots for `rows` rows: KV_SHARE of `free_bytes` less the prefix
    store's `prefix_tokens`, shared by the rows (each also has a scratch column), at most `context`."""
    budget = KV_SHARE * free_bytes - prefix_tokens * col_bytes
    return int(min(context, budget // (rows * col_bytes) - 1))


def refusal(rows: int, cols: int, free_gib: float) -> str | None:
    """The one-line reason slots of `rows` x `cols` are refused, or None."""
    if cols >= MIN_COLUMNS:
        return None
    return (
        f"K/V slots of {rows} rows get {max(cols, 0)} columns each from {free_gib:.1f} GiB free "
        f"(fewer than {MIN_COLUMNS}): lower policy.max_batch_size"
    )
