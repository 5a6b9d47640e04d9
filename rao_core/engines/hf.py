"""A transformers engine that batches the requests of every live node into one KV-cached decode.

Why: one sequence at a time costs milliseconds of Python per token on a CPU whatever the model
size, while a batch of 32 costs little more per step. So all nodes of all trees submit to one
queue, and a background task runs decode steps in a worker thread (the event loop keeps running
cells meanwhile):

- continuous batching: before every step, pending requests are admitted (up to max_batch_size
  sequences and max_batch_tokens of prompt + new tokens), prefilled together and merged into the
  running batch; a node that comes back from its cell joins the next step, not the next batch;
- K/V in fixed slots (kv_slots.KVSlots): a row per running sequence, position p at column p, so a
  decode step writes one column per row and nothing is copied when rows join or leave; decode
  attention runs per K/V head, in runs of rows of similar length;
- K/V reuse: a node's next prompt is its last prompt + reply + observation, so a finished row's
  K/V are kept and its next turn prefills only what was appended; a new node's prompt copies the
  beginning it shares with a stored one (the system prompt), and a wave of new prompts computes
  their shared beginning once (vLLM's prefix caching does this by blocks).

Log-prob convention: each returned log-prob is log p(token) under the distribution actually
sampled from, softmax(logits / T). For greedy requests (T = 0) it is the T = 1 log-softmax.

Two decode paths (`decode`): "runs" (the CPU's: rows of similar length attend in runs, sampled
one row at a time from torch generators) and "static" (the GPU's, hf_static.py: one fixed-shape
step over bucketed rows and columns, sampled on the device, read back once, replayed from CUDA
graphs); "auto" takes static on CUDA, runs on CPU. Both give model.generate's greedy tokens.

Seeds: a request with a `seed` draws its tokens from a random stream of its own, seeded with it, so
the tokens it samples do not depend on what else is in the batch or when it arrived (up to
floating-point differences between batch shapes, which move a draw only when it falls within
~1e-6 of a token boundary). Requests without one share the engine's generator.

Samplers (`sampler`): "multinomial" (runs path: torch.multinomial per row from the request's
generator) or "inverse_cdf" (the static path's: every row at once, the inverse CDF at a uniform
hashed from the request's key and token index, hf_static.sample_rows). multinomial draws one
exponential per vocabulary entry per row and token, single-threaded: at SmolLM2's 49,152 tokens
that was 36% of a 64-row decode step, at the tiny models' 330 nothing. "auto" keeps multinomial
up to MULTINOMIAL_VOCAB tokens (the tiny models' rollouts stay token for token what they were) and
takes inverse_cdf above. The static path always samples by inverse CDF, so with it the two paths
draw the same tokens for the same seed (up to floating-point ties); multinomial draws other ones.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rao_core.allocator import keep_freed_memory
from rao_core.engines import kv_budget
from rao_core.engines.hf_batch import Batch, EngineStats, Prefixes, StopCheck, sample_each_row
from rao_core.engines.hf_static import StaticDecode, request_key, sample_rows
from rao_core.engines.kv_slots import (
    ATTENTION,
    KVSlots,
    KVSpec,
    check_full_attention,
    fixed_shape,
    forward_in_slots,
)
from rao_core.models.tiny import load_checkpoint, resolve_model
from rao_core.policy import Generation, GenerationRequest, Policy

MULTINOMIAL_VOCAB = 8192  # sampler=auto: multinomial up to this vocabulary, inverse CDF above


@dataclass
class _Seq:
    request: GenerationRequest
    future: asyncio.Future
    budget: int  # new tokens allowed: min(max_new_tokens, context room)
    generator: torch.Generator | None = None  # the request's own, when it carries a seed (multinomial)
    key: int = 0  # the request's random stream (the inverse-CDF sampler)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    result: Generation | None = None

    @property
    def cost(self) -> int:
        return len(self.request.prompt_ids) + self.budget


@dataclass
class _LoopState:
    """Per event loop: the queue, the running batch, and the task that drives it."""

    batch: Batch
    pending: deque[_Seq] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class HFEngine(Policy):
    STEPS_PER_WAKE = 16

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch_size: int = 64,
        max_batch_tokens: int = 65536,
        context_limit: int | None = None,
        prefix_cache_tokens: int = kv_budget.PREFIX_TOKENS,
        seed: int = 0,
        version: int = 0,
        cpu_threads: int | None = 1,
        decode: str = "auto",
        cuda_graphs: bool = True,
        slot_memory: int | None = None,
        sampler: str = "auto",
    ) -> None:
        """`context_limit`: tokens per sequence, at most the model's `max_position_embeddings`
        (None: that). `prefix_cache_tokens`: tokens of finished conversations whose K/V are kept (0: none).
        `cpu_threads`: intra-op threads of the engine's worker thread on CPU (None: torch's default).
        One is the robust choice: when cores are oversubscribed (sandboxes, other jobs), OpenMP's
        spin-waiting made 2-thread decoding 18-25x slower on a 2-core machine. The setting is per
        thread: the rest of the process (training) keeps its own. The model's attention becomes
        the engine's slot attention (a plain forward of it is still stock SDPA). `decode`: runs,
        static or auto (module docstring); `cuda_graphs`: replay the static step from CUDA graphs.
        `slot_memory`: bytes from which the K/V slots are sized once, max_batch_size rows of fixed
        columns (kv_budget.py; a row reaching them ends with "context"); None: on CUDA with the
        static path, the memory free on the device now, else slots that grow as rows need."""
        self.model, self.tokenizer = model.eval(), tokenizer
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":
            keep_freed_memory()  # prefill activations and logits reused, not faulted in (allocator.py)
        check_full_attention(model.config)
        model.set_attn_implementation(ATTENTION)  # K/V in the engine's slots (plain forwards: SDPA)
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        limit = model.config.max_position_embeddings
        self.context_limit = min(context_limit or limit, limit)
        self.prefixes = Prefixes(prefix_cache_tokens)
        self.version = version
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.keys = random.Random(seed)  # the static path's streams of requests without a seed
        if decode not in ("auto", "runs", "static"):
            raise ValueError(f"decode: {decode!r} is not one of auto, runs, static")
        static = decode == "static" or (decode == "auto" and self.device.type == "cuda")
        if sampler not in ("auto", "multinomial", "inverse_cdf"):
            raise ValueError(f"sampler: {sampler!r} is not one of auto, multinomial, inverse_cdf")
        if sampler == "auto":
            small = model.config.get_text_config().vocab_size <= MULTINOMIAL_VOCAB
            sampler = "multinomial" if small and not static else "inverse_cdf"
        self.sampler = "inverse_cdf" if static else sampler
        self.stats = EngineStats()
        self.static = StaticDecode(model, max_batch_size, cuda_graphs, self.stats) if static else None
        self.kv_spec, self.slot_shape, self._slots = KVSpec.of(model), None, None
        if slot_memory is not None or (static and self.device.type == "cuda"):  # fixed (rows, columns)
            free = torch.cuda.mem_get_info(self.device)[0] if slot_memory is None else slot_memory
            self.slot_shape = fixed_shape(
                self.kv_spec, max_batch_size, self.context_limit, prefix_cache_tokens, free
            )
            self.context_limit = min(self.context_limit, self.slot_shape[1])
        self.stops = StopCheck(self._decode)
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {i for i in [*eos, tokenizer.eos_token_id] if i is not None}
        self._lock = threading.Lock()  # one forward at a time; weights never change mid-step
        threads = cpu_threads if self.device.type == "cpu" else None
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="hf-engine",
            initializer=torch.set_num_threads if threads else None,
            initargs=(threads,) if threads else (),
        )
        self._states: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._inflight = 0

    @classmethod
    def from_pretrained(cls, path: str | Path, tokenizer=None, device="auto", dtype="auto", **kw) -> HFEngine:
        model, tok = load_checkpoint(resolve_model(str(path)), device, dtype)
        return cls(model, tokenizer or tok, **kw)

    def new_batch(self) -> Batch:
        """An empty running batch: over growing slots of its own, or over the engine's one fixed
        store (allocated once, at the first batch; emptied, not freed, for the next), which one
        event loop at a time may use."""
        if self.slot_shape is None:
            return Batch(KVSlots(self.device, self.kv_spec))
        if self._slots is None:
            self._slots = KVSlots(self.device, self.kv_spec, *self.slot_shape, fixed=True)
        if any(st.batch is not None and st.batch.slots is self._slots for st in self._states.values()):
            raise RuntimeError("HFEngine: its fixed K/V slots serve one event loop at a time")
        self._slots.lens, self._slots.filled = self._slots.lens[:0], self._slots.filled[:0]
        return Batch(self._slots)

    # ---- the asyncio side -------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> Generation:
        room = self.context_limit - len(request.prompt_ids)
        if room <= 0:
            return Generation("", [], [], "context")
        if request.max_new_tokens <= 0:
            return Generation("", [], [], "length")
        loop = asyncio.get_running_loop()
        st = self._state(loop)
        seq = _Seq(request, loop.create_future(), min(request.max_new_tokens, room))
        if self.sampler == "inverse_cdf":
            seq.key = request_key(request.seed, self.keys)
        elif request.seed is not None and request.temperature > 0:
            seq.generator = torch.Generator(device=self.device).manual_seed(request.seed)
        st.pending.append(seq)
        st.wake.set()
        self.stats.requests += 1
        self._inflight += 1
        try:
            return await seq.future
        finally:
            self._inflight -= 1

    def _state(self, loop: asyncio.AbstractEventLoop) -> _LoopState:
        """Each event loop gets its own queue and runner (tests and the server use several)."""
        for other in [lp for lp in self._states if lp.is_closed()]:
            del self._states[other]
        st = self._states.get(loop)
        if st is None or st.task is None or st.task.done():
            if st is not None:
                st.batch = None  # its slots are free for the new batch
            st = self._states[loop] = _LoopState(self.new_batch())
            st.task = loop.create_task(self._run(st), name="hf-engine")
        return st

    async def _run(self, st: _LoopState) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not st.pending and not st.batch.seqs:
                st.wake.clear()
                await st.wake.wait()
                await asyncio.sleep(0)  # let every node that is ready this tick submit too
            for s in st.batch.seqs:
                if s.future.done() and s.finish is None:  # its node was cancelled
                    s.finish = "cancelled"
            new = self._admit(st)
            try:
                done = await loop.run_in_executor(self._executor, self._steps, st, new)
            except Exception as e:  # fail every request in the batch; the engine lives on
                for s in st.batch.seqs + new:
                    if not s.future.done():
                        s.future.set_exception(e)
                st.batch = None  # its slots are free for the new batch
                st.batch = self.new_batch()
                continue
            for s in done:
                if not s.future.done():
                    s.future.set_result(s.result)

    def _admit(self, st: _LoopState) -> list[_Seq]:
        used = sum(s.cost for s in st.batch.seqs)
        new: list[_Seq] = []
        while st.pending and len(st.batch.seqs) + len(new) < self.max_batch_size:
            s = st.pending[0]
            if s.future.done():
                st.pending.popleft()
                continue
            if used + s.cost > self.max_batch_tokens and (st.batch.seqs or new):
                break
            new.append(st.pending.popleft())
            used += s.cost
        return new

    async def close(self) -> None:
        """Cancel what is queued or running and stop the runner tasks; the engine is done after."""
        here = asyncio.get_running_loop()
        for loop, st in self._states.items():
            if loop is here:
                for s in [*st.pending, *st.batch.seqs]:
                    s.future.cancel()
                st.task.cancel()
                await asyncio.gather(st.task, return_exceptions=True)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(st.task.cancel)
        self._states.clear()
        self._executor.shutdown(wait=False)
        self._slots = None  # the fixed slots, the graphs and their memory pool go back to the device
        if self.static is not None:
            self.static.graphs = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- the worker-thread side -------------------------------------------------------------

    def _steps(self, st: _LoopState, new: list[_Seq]) -> list[_Seq]:
        """Steps in one wake of the worker: on while no row finishes and no request waits for a
        free row, so a step does not pay a round trip through the event loop (at most
        STEPS_PER_WAKE, so that a cancelled node's row stops soon)."""
        self.stats.wakes += 1
        done = self._step(st.batch, new)
        for _ in range(self.STEPS_PER_WAKE - 1):
            if done or not st.batch.seqs or (st.pending and len(st.batch.seqs) < self.max_batch_size):
                break
            done = self._step(st.batch, [])
        return done

    @torch.inference_mode()
    def _step(self, batch: Batch, new: list[_Seq]) -> list[_Seq]:
        """One decode step for the running rows, a prefill for admitted ones; returns finished rows."""
        with self._lock:
            batch.drop([i for i, s in enumerate(batch.seqs) if s.finish is not None])
            slots = batch.slots
            if batch.seqs and self.static is not None:
                start = time.perf_counter()
                rows = len(batch.seqs)
                tokens, logps = self.static.step(batch, rows)
                self._count_forward(rows)
                batch.advance(tokens[:rows].clone())  # a graph's output is overwritten next step
                self._record(batch.seqs, tokens[:rows], logps[:rows])
                self.stats.decode_seconds += time.perf_counter() - start
            elif batch.seqs:
                start = time.perf_counter()
                runs, sorted_ = batch.decode_runs()
                self.stats.sorts += sorted_
                cols = slots.lens[:, None]  # each row's last token goes to its next free column
                slots.plan(0, cols, cols, runs, length=int(slots.filled.max()) + 1)
                logits = self._forward(batch.last[:, None], cols, slots)
                batch.advance(self._sample(batch.seqs, logits))
                self.stats.decode_seconds += time.perf_counter() - start
            if new:
                start = time.perf_counter()
                self._prefill(batch, new)
                self.stats.prefill_seconds += time.perf_counter() - start
            done = [i for i, s in enumerate(batch.seqs) if self._check_finish(s)]
            for i in done:  # the slot holds prompt + all sampled tokens but the last
                s = batch.seqs[i]
                if self.prefixes.max_tokens > 0:
                    self.prefixes.put(s.request.prompt_ids + s.ids[:-1], slots.row_kv(i))
            done_seqs = [batch.seqs[i] for i in done]
            batch.drop(done)
        for s in done_seqs:
            s.result = Generation(self._decode(s.ids), s.ids, s.logprobs, s.finish)
        return done_seqs

    def _prefill(self, batch: Batch, seqs: list[_Seq]) -> None:
        """Admitted rows take the next slots. Each slot gets the K/V it can reuse (a stored
        conversation, or one pass over the beginning that a wave of new prompts shares: the system
        prompt), then one forward computes the rest of every prompt, left-padded so that every
        row's last token is the last column (padding writes to the scratch column)."""
        prompts = [list(s.request.prompt_ids) for s in seqs]
        use = self.prefixes.max_tokens > 0
        pasts = [self.prefixes.take(p) if use else None for p in prompts]
        self.stats.prefix_hits += sum(1 for p in pasts if p)
        fresh = [i for i, p in enumerate(pasts) if p is None]
        if use and len(fresh) > 1:
            shared = os.path.commonprefix([prompts[i] for i in fresh])[
                : min(len(prompts[i]) for i in fresh) - 1
            ]
            if len(shared) >= self.prefixes.min_shared:
                kv = self._kv_of(shared)
                for i in fresh:
                    pasts[i] = (len(shared), kv)
        known = [p[0] if p else 0 for p in pasts]
        todo = [p[k:] for p, k in zip(prompts, known, strict=True)]
        slots, first, width = batch.slots, len(batch.seqs), max(map(len, todo))
        length = max(k + len(t) for k, t in zip(known, todo, strict=True))
        slots.reserve(first + len(seqs), length)
        for i, p in enumerate(pasts):
            if p:
                slots.load(first + i, p[1])
        ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        cols = torch.full((len(seqs), width), slots.cols, dtype=torch.long)  # padding: scratch
        pos = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (k, t) in enumerate(zip(known, todo, strict=True)):
            ids[i, width - len(t) :] = torch.tensor(t)
            cols[i, width - len(t) :] = pos[i, width - len(t) :] = torch.arange(k, k + len(t))
        ids, cols, pos = ids.to(self.device), cols.to(self.device), pos.to(self.device)
        slots.plan(first, cols, pos, length=length)
        logits = self._forward(ids, pos, slots)
        temps = torch.tensor([s.request.temperature for s in seqs], dtype=torch.float64, device=self.device)
        keys = torch.tensor([s.key for s in seqs], device=self.device)
        counts = torch.zeros(len(seqs), dtype=torch.long, device=self.device)
        if self.static is not None:
            first_tokens, logps = sample_rows(logits, temps, keys, counts)
            self._record(seqs, first_tokens, logps)
        else:
            first_tokens = self._sample(seqs, logits)
        batch.append(seqs, first_tokens, temps, keys, counts + 1, [len(p) for p in prompts])
        self.stats.prompt_tokens += sum(map(len, prompts))
        self.stats.prefill_tokens += sum(map(len, todo))

    def _kv_of(self, ids: list[int]) -> torch.Tensor:
        """K/V of one token sequence, computed in one pass."""
        slots = KVSlots(self.device, self.kv_spec)
        pos = torch.arange(len(ids), device=self.device)[None]
        slots.plan(0, pos, pos, length=len(ids))
        self._forward(torch.tensor([ids], device=self.device), pos, slots)
        slots.filled = np.array([len(ids)])
        self.stats.prefill_tokens += len(ids)
        return slots.row_kv(0)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, slots: KVSlots) -> torch.Tensor:
        self._count_forward(ids.shape[0])
        start = time.perf_counter()
        logits = forward_in_slots(self.model, ids, pos, slots)
        self.stats.forward_seconds += time.perf_counter() - start
        return logits

    def _count_forward(self, rows: int) -> None:
        self.stats.batches += 1
        self.stats.batch_sizes.append(rows)

    def _record(self, seqs: list[_Seq], tokens: torch.Tensor, logps: torch.Tensor) -> None:
        """The one read of a static step: tokens and log-probs in one copy to the host."""
        self.stats.host_reads += 1
        ids, lps = torch.stack([tokens.double(), logps.double()]).tolist()
        for s, i, v in zip(seqs, ids, lps, strict=True):
            s.ids.append(int(i))
            s.logprobs.append(v)
        self.stats.tokens_generated += len(seqs)

    def _sample(self, seqs: list[_Seq], logits: torch.Tensor) -> torch.Tensor:
        """Greedy (T = 0) or ancestral sampling per row; log-probs under softmax(logits / T)."""
        temps = [s.request.temperature for s in seqs]
        if self.sampler == "inverse_cdf":  # every row at once, at its (key, token index)
            tok, lp = sample_rows(
                logits,
                torch.tensor(temps, dtype=torch.float64, device=logits.device),
                torch.tensor([s.key for s in seqs], device=logits.device),
                torch.tensor([len(s.ids) for s in seqs], device=logits.device),
            )
        else:  # each row from its own generator: batch-independent draws
            tok, lp = sample_each_row(logits, temps, [s.generator or self.generator for s in seqs])
        for s, i, v in zip(seqs, tok.tolist(), lp.tolist(), strict=True):
            s.ids.append(i)
            s.logprobs.append(v)
        self.stats.tokens_generated += len(seqs)
        return tok

    def _check_finish(self, s: _Seq) -> bool:
        if s.finish is not None:
            return True
        if s.ids[-1] in self.eos_ids or self.stops(s.ids, s.request.stop):
            s.finish = "stop"
        elif len(s.ids) >= s.request.max_new_tokens:
            s.finish = "length"
        elif len(s.ids) >= s.budget:
            s.finish = "context"
        return s.finish is not None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
