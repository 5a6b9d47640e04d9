"""The engine's K/V slots and the attention over them (docs/engines.md, HFEngine).

Only public transformers APIs: the engine's attention is a function registered with
`AttentionInterface` (as transformers' docs show for custom attention), and it reaches the engine's
slots through a keyword argument of the model call, which models pass through to attention. The
engine gives a ready 4D mask, which models take as is. tests/engines/test_hf_engine.py compares
every path with model.generate and a full forward; tests/engines/test_attention_layout.py every
attention call with what CUDA's kernels accept and return.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rao_core.engines import kv_budget

ATTENTION = "rao_slots"


def grouped_attention(query, keys, values, mask, scale) -> torch.Tensor:
    """Attention of `query` (b, heads, tokens, dim) over `keys`/`values` (b, kv_heads, columns,
    dim) under the boolean `mask` (b, 1, tokens, columns), as (b, tokens, heads, dim), contiguous.

    The query heads that share a K/V head become that head's query rows, so SDPA sees as many
    query heads as K/V heads, a boolean mask and no `enable_gqa`: a call CUDA's memory-efficient
    kernel accepts (flash refuses any mask; the memory-efficient kernel of the torch releases the
    project runs on refuses grouped heads; with both the call falls to the math kernel, in float32
    over the whole score matrix). Its output is reshaped, never viewed: the memory-efficient kernel
    returns it transposed in memory (tests/engines/test_attention_layout.py)."""
    b, heads, tokens, dim = query.shape
    kv = keys.shape[1]
    group = heads // kv
    # query head h = k * group + j is K/V head k's query rows j * tokens .. (j + 1) * tokens - 1
    rows = query.reshape(b, kv, group * tokens, dim)
    if tokens > 1:  # row j * tokens + t takes token t's mask
        mask = mask.repeat(1, 1, group, 1)
    out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask, scale=scale)
    out = out.view(b, kv, group, tokens, dim).permute(0, 3, 1, 2, 4)
    return out.reshape(b, tokens, heads, dim).contiguous()


def slot_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, kv_slots=None, **kw):
    """Write this forward's K/V into the engine's slots, then attend over the slots' columns, in
    the plan's runs of rows (a prefill and a static step: one run). Without `kv_slots` (a plain
    forward of the engine's model, e.g. a test's) it is stock SDPA."""
    if kv_slots is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kw)
    if kw.get("sliding_window"):
        raise NotImplementedError("HFEngine needs full-attention layers only (this one is sliding-window)")
    keys, values = kv_slots.write(module.layer_idx, key, value)
    outs = [
        grouped_attention(
            query[i:j], keys[i:j, :, :n], values[i:j, :, :n], attention_mask[i:j, ..., :n], scaling
        )
        for i, j, n in kv_slots.runs
    ]
    return (torch.cat(outs) if len(outs) > 1 else outs[0]), None


AttentionInterface.register(ATTENTION, slot_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the causal mask of a plain forward


def check_full_attention(config) -> None:
    """The slots hold every position of every layer: sliding-window and linear-attention layers
    (Gemma 2/3, Qwen3-Next, ...) are refused up front."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(text, "use_sliding_window", False):
        raise NotImplementedError(
            f"HFEngine needs full-attention layers only; this model has {sorted(kinds)}"
        )


class KVSpec(NamedTuple):
    """What one token's K/V is: layers, K/V heads, head_dim, dtype."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def column_bytes(self) -> int:
        """K and V of one token of one row, over every layer."""
        return kv_budget.column_bytes(self.layers, self.kv_heads * self.head_dim, self.dtype.itemsize)

    @classmethod
    def of(cls, model) -> KVSpec:
        c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = c.num_attention_heads
        dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        kv = getattr(c, "num_key_value_heads", None) or heads
        return cls(c.num_hidden_layers, kv, dim, next(model.parameters()).dtype)


def fixed_shape(spec: KVSpec, rows: int, context: int, prefix_tokens: int, memory: float) -> tuple[int, int]:
    """(rows, columns) of fixed slots that `memory` bytes give (kv_budget.py); too few columns
    are refused in one line."""
    cols = kv_budget.slot_columns(memory, rows, spec.column_bytes, context, prefix_tokens)
    if why := kv_budget.refusal(rows, cols, memory / 2**30):
        raise ValueError(f"HFEngine: {why}")
    return rows, cols


_ALLOCATIONS = itertools.count()


class KVSlots:
    """K/V of the running rows, one slot per row, every layer in one tensor:
    kv[layer, 0 (K) or 1 (V), row, head, column, dim]; the token at position p of row r sits at
    column p of slot r. A decode step writes one column per row and attends to a view of the first
    `n` slots, so nothing is copied when a row joins, grows or leaves (leaving rows' slots take the
    last rows': one copy for all of them). Loading or copying out a row's K/V is one copy over
    every layer, not one per layer. The last column is scratch, where padding tokens of a prefill
    write.

    A growing store (the CPU's) gets half again when it runs out; a fixed one (`fixed=True`: the
    static path on CUDA, sized from the device's memory by the engine, kv_budget.py) never moves,
    so captured CUDA graphs stay valid, and asking it for more is a bug that raises.

    Each row's filled columns are kept twice: `lens` on the device (what attention masks with) and
    `filled` on the host (what shapes and copies are sized with), so no size is ever read back
    from the device. `version` names the allocation (captured CUDA graphs hold its address)."""

    def __init__(self, device: torch.device, spec: KVSpec, rows: int = 0, cols: int = 0, fixed: bool = False):
        self.device, self.spec, self.fixed = torch.device(device), spec, fixed
        self.rows, self.cols = rows, cols  # capacity
        self.kv = self._new(rows, cols)
        self.version = next(_ALLOCATIONS)
        self.lens = torch.zeros(0, dtype=torch.long, device=device)  # filled columns per live row
        self.filled = np.zeros(0, dtype=np.int64)  # the same, on the host
        self._write_rows = self._write_cols = torch.empty(0)
        self._first, self._length = 0, 0
        self.mask = torch.empty(0, dtype=torch.bool)
        self.runs: list[tuple[int, int, int]] = []  # (first row, end row, columns) per attention call

    def _new(self, rows: int, cols: int) -> torch.Tensor:  # zeros: masked columns must hold no NaN
        layers, heads, dim, dtype = self.spec
        return torch.zeros((layers, 2, rows, heads, cols + 1, dim), dtype=dtype, device=self.device)

    def reserve(self, rows: int, cols: int) -> None:
        if rows <= self.rows and cols <= self.cols:
            return
        if self.fixed:
            raise RuntimeError(
                f"K/V slots: {rows} rows x {cols} columns asked of a fixed store of {self.rows} x {self.cols}"
            )
        grow = self.rows > 0  # past the first allocation, by half again, so growth is rare
        rows = max(rows, self.rows + self.rows // 2 if grow else 0) if rows > self.rows else self.rows
        cols = max(cols, self.cols + self.cols // 2 if grow else 0) if cols > self.cols else self.cols
        new = self._new(rows, cols)
        new[:, :, : self.rows, :, : self.cols] = self.kv[:, :, :, :, : self.cols]
        self.kv, self.rows, self.cols, self.version = new, rows, cols, next(_ALLOCATIONS)

    def plan(
        self, first: int, cols: torch.Tensor, pos: torch.Tensor, runs: list | None = None, length: int = 0
    ) -> None:
        """The next forward's rows are slots first..first+len(cols); its token (i, j), at position
        pos[i, j], is written to column cols[i, j] (self.cols: scratch, for padding) and attends to
        columns [0, pos[i, j]] (padding, at position 0: column 0 only), of the first `length`
        (default: the largest position + 1, read from the device). Attention runs in `runs`: rows
        i..j over columns [0, n) for each (i, j, n); default: one run over all rows."""
        self._length = length or int(pos.max()) + 1
        self.reserve(first + cols.shape[0], self._length)
        self._first, self._write_cols = first, cols
        self.runs = runs or [(0, cols.shape[0], self._length)]
        columns = torch.arange(self._length, device=self.device)
        self.mask = (columns <= pos[:, :, None])[:, None]  # (rows, 1, tokens, columns), True = attend
        rows = torch.arange(first, first + cols.shape[0], device=self.device)
        self._write_rows = rows[:, None].expand_as(cols)

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a forward's (batch, kv_heads, tokens, dim) K/V; return the columns to attend to."""
        k, v = self.kv[layer]
        k[self._write_rows, :, self._write_cols] = key.transpose(1, 2)
        v[self._write_rows, :, self._write_cols] = value.transpose(1, 2)
        rows = (0, self._first, key.shape[0])  # narrow, not [a:b]: the same ops whatever the capacity
        return k.narrow(*rows).narrow(2, 0, self._length), v.narrow(*rows).narrow(2, 0, self._length)

    def load(self, row: int, kv: torch.Tensor) -> None:
        """Put stored (layers, 2, kv_heads, n, dim) K/V at the start of slot `row`: one copy."""
        self.kv[:, :, row, :, : kv.shape[3]] = kv

    def row_kv(self, row: int) -> torch.Tensor:
        """A copy of slot `row`'s filled columns, (layers, 2, kv_heads, n, dim): one copy."""
        return self.kv[:, :, row, :, : int(self.filled[row])].clone()

    def permute(self, order: list[int]) -> None:
        """Row i takes row order[i]'s K/V (a copy of every filled column)."""
        n, idx = int(self.filled.max()), torch.tensor(order, device=self.device)
        self.kv[:, :, : len(order), :, :n] = self.kv[:, :, idx, :, :n]
        self.lens, self.filled = self.lens[idx], self.filled[order]

    def move(self, src: list[int], dst: list[int]) -> None:
        """Slot dst[i] takes slot src[i]'s filled columns, all at once (a gather and a scatter)."""
        n = int(self.filled[src].max())
        dst_idx = torch.tensor(dst, device=self.device)
        self.kv[:, :, dst_idx, :, :n] = self.kv[:, :, torch.tensor(src, device=self.device), :, :n]


# On CUDA the engine's attention leaves out cuDNN's kernels: they build an execution plan for
# every new shape, and a rollout's prefills and growing decodes bring new shapes all the time
# (bench/decode_bench.py times both; None: torch's own choice).
CUDA_ATTENTION: list[SDPBackend] | None = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


def forward_in_slots(model, ids: torch.Tensor, pos: torch.Tensor, slots: KVSlots) -> torch.Tensor:
    """Last-position logits (float32) of `model` on `ids` at positions `pos`, with K/V read from and
    written to `slots` as `slots.plan` set up; the plan's 4D mask goes to attention as is."""
    backends = CUDA_ATTENTION if ids.is_cuda and CUDA_ATTENTION else None
    with sdpa_kernel(backends) if backends else contextlib.nullcontext():
        out = model(
            input_ids=ids,
            attention_mask=slots.mask,
            position_ids=pos,
            use_cache=False,
            logits_to_keep=1,
            kv_slots=slots,
        )
    return out.logits[:, -1].float()
