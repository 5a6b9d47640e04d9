"""The engine's fixed-shape decode step: the path CUDA takes (docs/engines.md, "Decode paths").

On a GPU a decode step must do the same work whatever the number of rows in flight, and read the
device at most once; a Python loop over rows, or a size read back per layer, leaves the card idle.
So this path, unlike the CPU's runs of rows of similar length (hf_batch.row_runs):

- pads the rows and the columns to buckets (`row_bucket`, `column_bucket`): shapes repeat, and
  one attention call covers every row, each masked to its own length;
- samples on the device (`sample_rows`): a greedy row takes the argmax; a sampled row inverts its
  CDF at a uniform drawn from a counter-based hash of (the request's key, its token index), so a
  seeded request samples the same tokens whatever else is in the batch, with no generator per row;
- keeps each row's length, last token, temperature, key and count on the device (hf_batch.Batch),
  so nothing goes to the device per step, and the host reads the sampled tokens and their
  log-probs once;
- on CUDA, captures each (rows, columns) bucket's step as a CUDA graph and replays it: one launch
  instead of hundreds of kernels. A capture that fails falls back to eager steps, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import random

import torch

from rao_core.engines.hf_batch import KVSlots, forward_in_slots

log = logging.getLogger(__name__)

MASK32 = 0xFFFFFFFF
# From 2: a batch dimension of 1 takes other kernel paths inside torch (views instead of slices),
# so a lone row is padded to two and every step dispatches the same operators.
ROW_BUCKETS = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
MIN_COLUMNS = 256


def row_bucket(n: int) -> int:
    """The smallest bucket >= n: padding rows cost at most half again."""
    return next((b for b in ROW_BUCKETS if b >= n), -(-n // 256) * 256)


def column_bucket(n: int) -> int:
    """n rounded up to a step of 1/8 to 1/4 of its power of two, and of at least MIN_COLUMNS: a few
    buckets per doubling, so attention reads fewer than max(MIN_COLUMNS, n / 4) columns too many."""
    step = max(MIN_COLUMNS, 1 << max(0, (n - 1).bit_length() - 3))
    return -(-n // step) * step


def request_key(seed: int | None, rng: random.Random) -> int:
    """A request's 32-bit random stream: from its seed (the same seed, the same stream), else
    drawn from the engine's own seeded generator."""
    if seed is None:
        return rng.getrandbits(32)
    return int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=4).digest(), "little")


def _mix(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finalizer on int64 lanes holding 32-bit values (products wrap; the mask
    keeps the low 32 bits, which wrapping does not change)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def uniform(keys: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """One float32 in (0, 1) per row, a function of (key, count) only: 24 random bits."""
    bits = _mix(keys ^ _mix((counts * 0x9E3779B9 + 0x7F4A7C15) & MASK32))
    return ((bits >> 8).float() + 0.5) * 2.0**-24


def sample_rows(
    logits: torch.Tensor, temps: torch.Tensor, keys: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their log-probs under softmax(logits / T), every row at once: T = 0 rows take
    the argmax (log-prob at T = 1, the engine's convention), the others invert their CDF at
    `uniform(keys, counts)`. The first token whose cumulative probability exceeds the uniform has
    probability above 0, so a token the model rules out is never drawn."""
    greedy = temps <= 0
    logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
    cdf = logp.exp().cumsum(dim=-1)
    target = (uniform(keys, counts) * cdf[:, -1])[:, None]
    drawn = torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=logits.shape[1] - 1)
    tokens = torch.where(greedy, logp.argmax(dim=-1), drawn)
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


class StaticDecode:
    """One decode step of `rows` live rows at bucketed shapes, eager or replayed from a CUDA graph."""

    NAMES = ("last", "lens", "temps", "keys", "counts")

    def __init__(self, model, max_rows: int, graphs: bool) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.graphs_on = graphs and self.device.type == "cuda"
        self.capacity = row_bucket(max_rows + 1)  # a spare row: padding never fills the buffers
        self.graphs: dict[tuple[int, int], tuple] = {}  # (rows, columns) -> (graph, tokens, logps)
        self.version = -1  # the slots' version the graphs were captured against
        self.inputs: dict[str, torch.Tensor] = {}
        self.pool = None

    def step(self, batch, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and log-probs of rows [0, bucket) (the first `rows` are live); K/V written."""
        slots: KVSlots = batch.slots
        padded, columns = row_bucket(rows), column_bucket(int(slots.filled.max()) + 1)
        slots.reserve(max(padded, self.capacity if self.graphs_on else 0), columns)
        inputs = self._stage([batch.last, slots.lens, batch.temps, batch.keys, batch.counts], rows, padded)
        if self.graphs_on:
            try:
                return self._replay(slots, inputs, padded, columns)
            except RuntimeError as e:  # a model or kernel that cannot be captured: eager from now on
                log.warning("HFEngine: CUDA graph capture failed (%s); decoding eagerly", e)
                self.graphs_on, self.graphs = False, {}
        return self._compute(slots, *inputs, columns)

    def _stage(self, values: list[torch.Tensor], rows: int, padded: int) -> list[torch.Tensor]:
        """The rows' values copied into fixed input buffers, padding rows zeroed (length 0, greedy):
        device copies only, the same operators whatever `rows`, and the tensors a graph reads."""
        if not self.inputs:
            self.inputs = {n: torch.zeros(self.capacity, dtype=v.dtype, device=self.device)
                           for n, v in zip(self.NAMES, values, strict=True)}  # fmt: skip
        for name, v in zip(self.NAMES, values, strict=True):
            self.inputs[name][:padded].zero_()
            self.inputs[name][:rows].copy_(v)
        return [self.inputs[n][:padded] for n in self.NAMES]

    def _compute(self, slots, last, lens, temps, keys, counts, columns: int):
        """The step itself: the plan's mask from the lengths, the forward, the sampling."""
        pos = lens[:, None]  # each row's new token goes to its next free column
        slots.plan(0, pos, pos, length=columns)
        logits = forward_in_slots(self.model, last[:, None], pos, slots)
        return sample_rows(logits, temps, keys, counts)

    def _replay(self, slots, inputs: list[torch.Tensor], padded: int, columns: int):
        if slots.version != self.version:  # new K/V tensors: every graph read the old ones
            self.graphs, self.version = {}, slots.version
        key = (padded, columns)
        if key not in self.graphs:
            self.graphs[key] = self._capture(slots, inputs, columns)
        graph, tokens, logps = self.graphs[key]
        graph.replay()
        return tokens, logps

    def _capture(self, slots, views: list[torch.Tensor], columns: int):
        """Warm up on a side stream (as torch's docs ask), then record the step into a graph that
        shares one memory pool with the others."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._compute(slots, *views, columns)
        torch.cuda.current_stream().wait_stream(side)
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            tokens, logps = self._compute(slots, *views, columns)
        return graph, tokens, logps
