"""The engine's fixed-shape decode step: the path CUDA takes (docs/engines.md, "Decode paths").

On a GPU a decode step must do the same work whatever the number of rows in flight, and read the
device at most once; a Python loop over rows, or a size read back per layer, leaves the card idle.
So this path, unlike the CPU's runs of rows of similar length (hf_batch.row_runs):

- pads the rows and the columns to buckets (`row_bucket`, `column_bucket`): shapes repeat, and
  one attention call covers every row, each masked to its own length;
- samples on the device (`sample_rows`), in float64: a greedy row takes the argmax; a sampled row
  inverts its CDF at a 53-bit uniform drawn from a counter-based hash of (the request's key, its
  token index), so a seeded request samples the same tokens whatever else is in the batch, with no
  generator per row, and a rare token is drawn with the probability its stored log-prob says;
- keeps each row's length, last token, temperature, key and count on the device (hf_batch.Batch),
  so nothing goes to the device per step, and the host reads the sampled tokens and their
  log-probs once;
- on CUDA, captures each (rows, columns) bucket's step as a CUDA graph, once (the K/V slots are
  fixed there: kv_budget.py), and replays it: one launch instead of hundreds of kernels. A capture
  that fails falls back to eager steps, with a warning; every other error reaches the caller.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable

import torch

from rao_core.engines.kv_slots import KVSlots, forward_in_slots

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
    """One float64 in (0, 1) per row, a function of (key, count) only: 53 random bits (27 and 26
    from two hashes), so no interval of the CDF narrower than a float32 step is out of reach."""
    c = counts * 0x9E3779B9
    hi = _mix(keys ^ _mix((c + 0x7F4A7C15) & MASK32)) >> 5
    lo = _mix(keys ^ _mix((c + 0x2545F491) & MASK32)) >> 6
    return (((hi << 26) | lo).double() + 0.5) * 2.0**-53


def log_probs(logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """log softmax(logits / T) per row in float64 (T = 0 rows at T = 1): what is sampled from and
    stored, to float64's precision."""
    greedy = temps <= 0
    return torch.log_softmax(logits.double() / torch.where(greedy, 1.0, temps).double()[:, None], dim=-1)


def invert_cdf(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability (float64) exceeds u x the total: token
    k is drawn for u in an interval as wide as its probability, up to float64 rounding, however
    small (a float32 sum over 150k tokens would round every interval to multiples of ~6e-8). A
    token of probability 0 has an empty interval: never drawn."""
    cdf = logp.exp().cumsum(dim=-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return drawn.clamp_(max=logp.shape[1] - 1)


def sample_rows(
    logits: torch.Tensor, temps: torch.Tensor, keys: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their float64 log-probs under softmax(logits / T), every row at once: T = 0 rows
    take the argmax (log-prob at T = 1, the engine's convention), the others invert their CDF at
    `uniform(keys, counts)`."""
    logp = log_probs(logits, temps)
    tokens = torch.where(temps <= 0, logp.argmax(dim=-1), invert_cdf(logp, uniform(keys, counts)))
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


class CUDAGraphs:
    """How the static step is captured on CUDA: a warm-up on a side stream (as torch's docs ask),
    then a graph recorded into one memory pool shared by every bucket's graph."""

    def __init__(self) -> None:
        self.pool = None

    def warm_up(self, fn: Callable[[], tuple]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)

    def record(self, fn: Callable[[], tuple]) -> tuple[Callable[[], None], tuple]:
        """(replay, the outputs each replay overwrites)."""
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = fn()
        return graph.replay, out


class StaticDecode:
    """One decode step of `rows` live rows at bucketed shapes, eager or replayed from a graph.

    Rows are padded to `row_bucket(rows)`, at most `max_rows` (no spare bucket: the engine's slots
    hold exactly max_rows rows); columns to `column_bucket`, at most the slots' fixed columns.
    With fixed slots (CUDA) each (rows, columns) bucket is captured once for the engine's life.

    Errors: a capture that fails (a model or kernel that cannot be captured) turns graphs off, with
    one warning, and the step runs eagerly; the warm-up before it is an eager step, so its errors
    are the eager path's and reach the caller, as does any error of a replay, an out-of-memory
    error included: a fault is never taken for "cannot be captured"."""

    NAMES = ("last", "lens", "temps", "keys", "counts")

    def __init__(self, model, max_rows: int, graphs: bool, stats=None, recorder=None) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.recorder = recorder or (CUDAGraphs() if self.device.type == "cuda" else None)
        self.graphs_on = graphs and self.recorder is not None
        self.capacity = max_rows
        self.graphs: dict[tuple[int, int], tuple] = {}  # (rows, columns) -> (replay, (tokens, logps))
        self.version = -1  # the slots' allocation the graphs were captured against
        self.inputs: dict[str, torch.Tensor] = {}
        self.stats = stats  # the engine's EngineStats: graph_captures, graph_fallbacks, forward_seconds

    def step(self, batch, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and log-probs of rows [0, bucket) (the first `rows` are live); K/V written."""
        slots: KVSlots = batch.slots
        padded = min(row_bucket(rows), self.capacity)
        columns = column_bucket(int(slots.filled.max()) + 1)
        columns = min(columns, slots.cols) if slots.fixed else columns
        slots.reserve(padded, columns)
        inputs = self._stage([batch.last, slots.lens, batch.temps, batch.keys, batch.counts], rows, padded)
        start = time.perf_counter()
        out = self._replay(slots, inputs, padded, columns) if self.graphs_on else None
        if out is None:
            out = self._compute(slots, *inputs, columns)
        if self.stats is not None:
            self.stats.forward_seconds += time.perf_counter() - start
        return out

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
        """The bucket's graph replayed (captured first if new); None once graphs are off."""
        if slots.version != self.version:  # another allocation: every graph read the old one
            self.graphs, self.version = {}, slots.version
        key = (padded, columns)
        if key not in self.graphs:
            captured = self._capture(slots, inputs, columns)
            if captured is None:
                return None
            self.graphs[key] = captured
        replay, out = self.graphs[key]
        replay()
        return out

    def _capture(self, slots, views: list[torch.Tensor], columns: int):
        def compute():
            return self._compute(slots, *views, columns)

        self.recorder.warm_up(compute)  # an eager step: its errors are the eager path's, raised
        try:
            captured = self.recorder.record(compute)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:  # a model or kernel that cannot be captured: eager from now on
            log.warning("HFEngine: CUDA graph capture failed (%s); decoding eagerly", e)
            self.graphs_on, self.graphs = False, {}
            if self.stats is not None:
                self.stats.graph_fallbacks += 1
            return None
        if self.stats is not None:
            self.stats.graph_captures += 1
        return captured
