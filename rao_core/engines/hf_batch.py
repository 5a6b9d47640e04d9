"""The batching engine's data structures: the running rows over their K/V slots, the K/V of
finished conversations kept for their next turn, and stop-string checks (docs/engines.md, HFEngine).

The K/V slots themselves and the attention over them are kv_slots.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from rao_core.engines.kv_slots import KVSlots


def completes_stop(ids: Sequence[int], decode: Callable[[list[int]], str], stops: Sequence[str]) -> bool:
    """Does the text of `ids` contain a stop string near its end? Decodes only a tail window long
    enough for the longest stop (every token holds at least one byte), so a per-step check costs
    O(1); callers check after every token, so the first hit is at the completing token."""
    if not stops or not ids:
        return False
    window = max(len(s.encode()) for s in stops) + 1
    tail = decode(list(ids[-window:]))
    return any(s in tail for s in stops)


class StopCheck:
    """`completes_stop` for a growing reply, skipping the tail decode for tokens that cannot
    complete a stop string. A token that completes one holds the stop's last character in its own
    text, or a piece of a multi-byte character (its text alone is U+FFFD); whitespace at a stop's
    end can be hidden by a tokenizer's spacing rules, so such stops always decode. The verdict per
    token is cached for each set of stops (a decode of one token, once)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.may_complete: dict[tuple[str, ...], dict[int, bool]] = {}

    def __call__(self, ids: Sequence[int], stops: Sequence[str]) -> bool:
        if not stops or not ids:
            return False
        key = tuple(stops)
        verdicts = self.may_complete.setdefault(key, {})
        token = ids[-1]
        if token not in verdicts:
            text = self.decode([token])
            verdicts[token] = "\ufffd" in text or any(not s or s[-1].isspace() or s[-1] in text for s in key)
        return verdicts[token] and completes_stop(ids, self.decode, stops)


def stop_index(ids: Sequence[int], decode: Callable[[list[int]], str], stops: Sequence[str]) -> int | None:
    """Tokens to keep: up to and including the token that completes the first stop string, or
    None if the decoded text never contains one."""
    for k in range(1, len(ids) + 1):
        if completes_stop(ids[:k], decode, stops):
            return k
    return None


def row_runs(lens: list[int], run_cost: int = 512) -> tuple[list[tuple[int, int, int]], int]:
    """Rows in slot order cut into contiguous runs, each attending over its longest row's columns:
    a new run starts where padding the current one to the next row (or that row to it) would read
    more than `run_cost` padding columns (the price of one more attention call). Returns the runs
    as (first, end, columns) and the padding columns they read."""
    runs, first, hi, total, waste = [], 0, lens[0], lens[0], 0
    for i, n in enumerate(lens[1:], 1):
        extra = (i - first) * (n - hi) if n > hi else hi - n
        if extra > run_cost:
            runs.append((first, i, hi))
            waste += (i - first) * hi - total
            first, hi, total = i, n, n
        else:
            hi, total = max(hi, n), total + n
    runs.append((first, len(lens), hi))
    return runs, waste + (len(lens) - first) * hi - total


class Batch:
    """The running rows: their requests, K/V slots (row i = slot i), and per row on the device the
    last sampled token and what the fixed-shape decode samples with (hf_static.sample_rows)."""

    def __init__(self, slots: KVSlots) -> None:
        self.seqs: list = []  # the engine's requests, one per row
        self.slots = slots
        device = slots.device
        self.last = torch.zeros(0, dtype=torch.long, device=device)
        self.temps = torch.zeros(0, dtype=torch.float64, device=device)  # sampling temperature
        self.keys = torch.zeros(0, dtype=torch.long, device=device)  # the request's random stream
        self.counts = torch.zeros(0, dtype=torch.long, device=device)  # tokens sampled so far

    def append(self, seqs: list, last, temps, keys, counts, filled: list[int]) -> None:
        """Rows prefilled into the next slots join (their K/V is already there)."""
        self.seqs += seqs
        self.last = torch.cat([self.last, last])
        self.temps = torch.cat([self.temps, temps])
        self.keys = torch.cat([self.keys, keys])
        self.counts = torch.cat([self.counts, counts])
        self.slots.lens = torch.cat([self.slots.lens, torch.as_tensor(filled, device=self.last.device)])
        self.slots.filled = np.concatenate([self.slots.filled, np.asarray(filled, dtype=np.int64)])

    def advance(self, tokens: torch.Tensor) -> None:
        """After a decode step: every row holds one more column and samples from `tokens` next."""
        self.last = tokens
        self.counts = self.counts + 1
        self.slots.lens = self.slots.lens + 1
        self.slots.filled = self.slots.filled + 1

    def decode_runs(self, sort_at: float = 0.5) -> tuple[list[tuple[int, int, int]], bool]:
        """Runs of rows of similar length for the next decode step (columns: each row's length + 1):
        one attention call over the longest row's columns would read mostly padding when lengths
        differ. When runs in slot order still read more than `sort_at` padding per real column,
        rows are sorted by length first (a copy of the cache; joining and leaving rows then disturb
        the order only a little)."""
        lens = (self.slots.filled + 1).tolist()
        runs, waste = row_runs(lens)
        if waste <= sort_at * sum(lens):
            return runs, False
        order = sorted(range(len(lens)), key=lambda i: -lens[i])
        self.slots.permute(order)
        idx = torch.tensor(order, device=self.last.device)
        self.seqs = [self.seqs[i] for i in order]
        self.last, self.temps, self.keys, self.counts = (
            t[idx] for t in (self.last, self.temps, self.keys, self.counts)
        )
        return row_runs([lens[i] for i in order])[0], True

    def drop(self, gone: list[int]) -> None:
        """Remove rows `gone`: each hole takes the current last row, as if one at a time from the
        highest hole down, all moved at once (one gather per tensor, one K/V copy for all rows)."""
        if not gone:
            return
        order = list(range(len(self.seqs)))
        for i in sorted(gone, reverse=True):
            last = order.pop()
            if i < len(order):
                order[i] = last
        slots, idx = self.slots, torch.tensor(order, dtype=torch.long, device=self.last.device)
        moved = [(src, dst) for dst, src in enumerate(order) if src != dst]
        if moved:
            slots.move([src for src, _ in moved], [dst for _, dst in moved])
        self.seqs = [self.seqs[i] for i in order]
        slots.filled = slots.filled[order]
        slots.lens, self.last, self.temps, self.keys, self.counts = (
            t[idx] for t in (slots.lens, self.last, self.temps, self.keys, self.counts)
        )


class Prefixes:
    """K/V of finished rows with the tokens they cover, oldest dropped past `max_tokens` tokens.

    A prompt that extends a stored conversation takes it whole (it is removed: conversations only
    grow); otherwise the longest shared beginning of at least `min_shared` tokens (the system
    prompt every node shares) is copied out and the entry stays. Tokens are kept as int32 bytes
    too, so "does this prompt extend that conversation" is one C-level startswith per entry."""

    def __init__(self, max_tokens: int, min_shared: int = 32) -> None:
        self.max_tokens, self.min_shared, self.tokens, self.count = max_tokens, min_shared, 0, 0
        self.entries: dict[int, tuple[np.ndarray, bytes, torch.Tensor]] = {}  # oldest first

    def put(self, ids: list[int], kv: torch.Tensor) -> None:
        """Keep `kv`, (layers, 2, kv_heads, len(ids), dim), the K/V of `ids`."""
        if not ids or len(ids) > self.max_tokens:
            return
        arr = np.asarray(ids, dtype=np.int32)
        self.entries[self.count] = (arr, arr.tobytes(), kv)
        self.tokens, self.count = self.tokens + len(ids), self.count + 1
        while self.tokens > self.max_tokens:
            self.tokens -= len(self.entries.pop(next(iter(self.entries)))[0])

    def take(self, prompt: list[int]) -> tuple[int, torch.Tensor] | None:
        """(n, K/V of prompt[:n]) with n < len(prompt), or None."""
        p = np.asarray(prompt, dtype=np.int32)
        raw = p.tobytes()
        whole = [k for k, (ids, b, _) in self.entries.items() if len(ids) < len(p) and raw.startswith(b)]
        if whole:
            key = max(whole, key=lambda k: len(self.entries[k][0]))
            ids, _, kv = self.entries.pop(key)
            self.tokens -= len(ids)
            return len(ids), kv
        best, best_n, head = None, 0, raw[: 4 * self.min_shared]  # 4 bytes a token
        for key, (ids, b, _) in self.entries.items():
            m = min(len(ids), len(p) - 1)
            if m <= best_n or m < self.min_shared or b[: len(head)] != head:  # cannot share enough
                continue
            differ = np.flatnonzero(ids[:m] != p[:m])
            n = int(differ[0]) if len(differ) else m
            if n > best_n:
                best, best_n = key, n
        if best is None or best_n < self.min_shared:
            return None
        return best_n, self.entries[best][2][:, :, :, :best_n]

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0


@dataclass
class EngineStats:
    requests: int = 0
    batches: int = 0  # forward passes (a prefill of admitted prompts, or one decode step)
    batch_sizes: list[int] = field(default_factory=list)  # sequences in each forward pass
    tokens_generated: int = 0
    prompt_tokens: int = 0  # prompt tokens of admitted requests
    prefill_tokens: int = 0  # of those, the ones computed (the rest came from reused K/V)
    prefix_hits: int = 0
    prefill_seconds: float = 0.0  # time in prefill forward passes (worker thread)
    decode_seconds: float = 0.0  # time in decode steps (the static path: staging, forward, sampling)
    forward_seconds: float = 0.0  # of decode and prefill, time in the model's forwards (and the
    # static step's sampling, which its graph replays); on CUDA the launches only: the kernels run on
    # after it returns, and their time is in the host read that waits for the sampled tokens
    sorts: int = 0  # decode steps that first sorted the rows by length (docs/engines.md)
    host_reads: int = 0  # device -> host reads of sampled tokens (the static path: one per step)
    graph_captures: int = 0  # CUDA graphs captured (the static path: one per (rows, columns) bucket)
    graph_fallbacks: int = 0  # captures that failed and turned graphs off (eager steps from then on)
    wakes: int = 0  # round trips between the event loop and the worker thread (steps: batches)


def sample_each_row(
    logits: torch.Tensor, temps: list[float], generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy (T = 0) or torch.multinomial per row from its generator; (tokens, log-probs under
    softmax(logits / T), the T = 1 log-softmax for greedy rows)."""
    t = torch.tensor([x if x > 0 else 1.0 for x in temps], device=logits.device)
    logp = torch.log_softmax(logits / t[:, None], dim=-1)
    tok = logp.argmax(-1)
    probs = logp.exp()
    for i, g in enumerate(generators):
        if temps[i] > 0:
            tok[i] = torch.multinomial(probs[i], 1, generator=g)[0]
    return tok, logp.gather(1, tok[:, None]).squeeze(1)
