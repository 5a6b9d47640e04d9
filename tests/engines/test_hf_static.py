"""The fixed-shape decode path (hf_static.py): its sampler against the distribution it claims,
batch-independent seeded draws, its buckets, the stop-string shortcut against the plain check, and
one step's work and host reads whatever the rows in flight (what bench/decode_bench.py prints)."""

from __future__ import annotations

import asyncio
import math
import random
import time

import numpy as np
import pytest
import torch

from rao_core.engines import kv_budget
from rao_core.engines.hf import HFEngine
from rao_core.engines.hf_batch import StopCheck, completes_stop
from rao_core.engines.hf_static import (
    column_bucket,
    invert_cdf,
    log_probs,
    request_key,
    row_bucket,
    sample_rows,
    uniform,
)
from rao_core.engines.kv_slots import KVSpec
from rao_core.models.tiny import build_tiny_model
from rao_core.models.tokenizer import tiny_tokenizer
from tests.engines import ReplayedGraphs, gqa_model, req, small_model

TOK = tiny_tokenizer()


def test_sampled_frequencies_follow_softmax_over_temperature():
    """40,000 draws from one row's distribution (each its own key) against softmax(logits / T),
    by a chi-square test; a token at -inf is never drawn; greedy rows take the argmax."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(12, generator=gen) * 2
    logits[5] = -math.inf
    n, temp = 40_000, 0.7
    keys = torch.tensor([request_key(i, random.Random(0)) for i in range(n)])
    temps = torch.full((n,), temp, dtype=torch.float64)
    tokens, logps = sample_rows(logits.expand(n, -1), temps, keys, torch.zeros(n).long())
    probs = torch.softmax(logits.double() / temp, -1)
    counts = torch.bincount(tokens, minlength=12).double()
    assert counts[5] == 0
    live = probs > 0
    chi2 = float((((counts - n * probs) ** 2)[live] / (n * probs[live])).sum())
    assert chi2 < 35.0, chi2  # 10 degrees of freedom: P(chi2 > 35) < 1e-4
    assert logps.dtype == torch.float64 and torch.allclose(logps, probs[tokens].log(), rtol=1e-12)
    greedy, greedy_lp = sample_rows(logits[None], torch.zeros(1), keys[:1], torch.zeros(1).long())
    assert int(greedy) == int(logits.argmax())
    assert torch.allclose(greedy_lp, torch.log_softmax(logits.double(), -1).max(), rtol=1e-12)


def test_tail_probabilities_are_exact_to_float64():
    """Item 7 of issue 51: a token of probability ~1e-11 last of a 151,936-token vocabulary (where
    the running sum is near 1) is drawn for exactly the uniforms of its float64 interval, computed
    here with exact sums (math.fsum), and its log-prob is log p to float64's precision. A float32
    running sum rounds that interval to 0 or ~6e-8, and a 24-bit uniform cannot land in it."""
    vocab = 151_936
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
    logits[-1] = -12.0  # about 2.5e-11 of the mass
    logp = log_probs(logits[None], torch.ones(1))
    p = [math.exp(x) for x in logp[0].tolist()]
    total = math.fsum(p)
    lo, hi = math.fsum(p[:-1]) / total, 1.0  # the last token's interval of the uniform
    assert 1e-12 < hi - lo < 1e-10
    for at in (0.1, 0.5, 0.9):
        assert int(invert_cdf(logp, torch.tensor([lo + at * (hi - lo)], dtype=torch.float64))) == vocab - 1
    assert int(invert_cdf(logp, torch.tensor([lo - 0.5 * (hi - lo)], dtype=torch.float64))) == vocab - 2
    assert math.isclose(float(logp[0, -1]), math.log(p[-1] / total), rel_tol=1e-12)
    # the uniform resolves far below float32's steps: 53 random bits, none of them constant
    u = uniform(torch.arange(4096), torch.zeros(4096).long())
    assert u.dtype == torch.float64 and bool(((u * 2.0**24) % 1 != 0).all())
    bits = ((u * 2.0**53) - 0.5).long()
    assert all(0 < int(((bits >> k) & 1).sum()) < 4096 for k in range(53))


def test_the_uniform_is_a_function_of_key_and_count_only():
    keys, counts = torch.tensor([7, 7, 8, 2**32 - 1]), torch.tensor([0, 1, 0, 5])
    u = uniform(keys, counts)
    assert torch.equal(u, uniform(keys.flip(0), counts.flip(0)).flip(0))  # no dependence on the row
    assert len(set(u.tolist())) == 4 and bool(((u > 0) & (u < 1)).all())
    many = uniform(torch.arange(50_000), torch.zeros(50_000).long())
    assert abs(float(many.mean()) - 0.5) < 0.01 and abs(float(many.var()) - 1 / 12) < 0.003
    assert request_key(3, random.Random(0)) == request_key(3, random.Random(1))  # a seed names a stream


def test_buckets_cover_and_stay_close():
    for n in range(1, 3000):
        r = row_bucket(n)
        assert n <= r <= max(2, math.ceil(1.5 * n)) or n > 1024
        assert r >= 2
        c = column_bucket(n)
        assert n <= c < n + max(256, n / 4), (n, c)
    assert len({column_bucket(n) for n in range(1, 32_768)}) < 40  # few shapes: few CUDA graphs


def test_seeded_draws_do_not_depend_on_the_batch():
    """A seeded request at T = 1 samples the same tokens alone and amid seven others."""
    engine = HFEngine(small_model(TOK), TOK, decode="static")
    rng = random.Random(3)
    ps = [[rng.randrange(3, len(TOK)) for _ in range(rng.randint(3, 60))] for _ in range(8)]

    def seeded(i):
        r = req(ps[i], 12, temperature=1.0)
        return type(r)(r.prompt_ids, r.max_new_tokens, r.stop, r.node, r.temperature, seed=100 + i)

    async def go():
        together = await asyncio.gather(*[engine.generate(seeded(i)) for i in range(8)])
        alone = [await engine.generate(seeded(i)) for i in range(8)]
        await engine.close()
        return together, alone

    together, alone = asyncio.run(go())
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert len({tuple(g.token_ids) for g in together}) == 8


def test_stop_shortcut_agrees_with_the_plain_check():
    """On random token streams (multi-byte pieces included) and random stops, some ending in
    whitespace or a non-ASCII character: StopCheck says what completes_stop says, at every token."""
    rng = random.Random(0)
    check = StopCheck(lambda ids: TOK.decode(ids, skip_special_tokens=True))
    vocab = list(range(len(TOK)))
    texts = ["</python>", "on> t", "x.", "é>", "a \n", " ", "```\n", "</think>"]
    for _ in range(300):
        stops = tuple(rng.sample(texts, rng.randint(1, 3)))
        ids: list[int] = []
        for _ in range(rng.randint(1, 40)):
            ids.append(rng.choice(vocab) if rng.random() < 0.5 else rng.choice(TOK.encode(rng.choice(texts))))
            plain = completes_stop(ids, check.decode, stops)
            assert check(ids, stops) == plain, (ids, stops)


def count_step(engine: HFEngine, rows: int) -> tuple[int, int]:
    """(operators dispatched, host reads) of one decode step with `rows` rows in flight, counted
    with torch.profiler; the same function bench/decode_bench.py prints."""
    from bench.decode_bench import ops_of_one_step

    ops, syncs, reads = ops_of_one_step(engine, rows, prompt_len=20)
    return ops, syncs + reads


@pytest.mark.parametrize("decode", ["static"])
def test_one_step_does_the_same_work_for_1_16_and_64_rows(decode):
    engine = HFEngine(small_model(TOK), TOK, decode=decode)
    counted = [count_step(engine, rows) for rows in (1, 16, 64)]
    assert len({ops for ops, _ in counted}) == 1, counted
    assert all(syncs <= 1 for _, syncs in counted), counted
    runs = HFEngine(small_model(TOK), TOK, decode="runs")  # the CPU path: a draw per row
    assert count_step(runs, 16)[0] > count_step(runs, 1)[0]


# ---- fixed K/V slots and CUDA graphs (issue 51, items 2, 4, 5, 6), with graphs stood in for on the CPU


def graphed_engine(kv_heads: int = 2, rows: int = 8, columns: int = 700, **kw) -> HFEngine:
    """The static path as CUDA runs it: fixed slots of `rows` x `columns` (sized from the memory
    they take, as on a GPU from the memory free) and graphs on, recorded by ReplayedGraphs."""
    model = gqa_model(TOK, kv_heads)
    spec = KVSpec.of(model)
    col = kv_budget.column_bytes(spec.layers, spec.kv_heads * spec.head_dim, 4)
    memory = ((columns + 1) * rows + kw.get("prefix_cache_tokens", 65536)) * col / kv_budget.KV_SHARE
    engine = HFEngine(model, TOK, max_batch_size=rows, decode="static", slot_memory=int(memory) + 1, **kw)
    engine.static.recorder, engine.static.graphs_on = ReplayedGraphs(engine), True
    return engine


def generate(engine: HFEngine, requests, stagger: int = 0) -> list:
    """Every request's generation; with `stagger`, request i arrives after i x stagger steps. The
    engine's forward number n waits for the requests due by then, so they join one by one however
    loaded the machine is (polling alone let two join at once when a poll came late)."""
    arrived = [0]
    if stagger:
        count_forward = engine._count_forward

        def gated(rows: int) -> None:
            due = sum(i * stagger <= engine.stats.batches for i in range(len(requests)))
            while arrived[0] < due:
                time.sleep(0.001)
            count_forward(rows)

        engine._count_forward = gated

    async def one(i, r):
        while engine.stats.batches < i * stagger:
            await asyncio.sleep(0.001)
        arrived[0] += 1
        return await engine.generate(r)

    async def go():
        try:
            return await asyncio.gather(*[one(i, r) for i, r in enumerate(requests)])
        finally:
            await engine.close()

    return asyncio.run(go())


def test_slots_are_sized_from_memory_once_without_a_spare_bucket():
    """Item 4: max_batch_size rows exactly (5 rows are padded to 5, not 6), the columns the memory
    gives (the context limit follows: a longer row ends with 'context', no error), one allocation
    for the engine's life; too little memory is refused in one line."""
    engine = graphed_engine(rows=5, columns=300, prefix_cache_tokens=0)
    assert engine.slot_shape == (5, 300) and engine.context_limit == 300
    slots = engine.new_batch().slots
    version = slots.version
    rng = random.Random(0)
    requests = [req([rng.randrange(3, len(TOK)) for _ in range(n)], 60) for n in (10, 20, 30, 250, 290)]
    outs = generate(engine, requests)
    assert [g.finish_reason for g in outs[3:]] == ["context", "context"]
    assert len(outs[3].token_ids) == 50 and len(outs[4].token_ids) == 10
    assert engine._slots is None  # closed: given back
    assert slots.version == version and slots.kv.shape[2] == 5 and slots.kv.shape[4] == 301
    assert max(r for r, _ in engine.static.recorder.recorded) == 5
    with pytest.raises(ValueError, match=r"^HFEngine: K/V slots of 64 rows get \d+ columns each from "):
        HFEngine(gqa_model(TOK, 2), TOK, max_batch_size=64, decode="static", slot_memory=2**20)
    # Qwen3-0.6B in bf16 (112 KiB a token), 100 GiB free: (60 GiB - 7 GiB of prefix store) / (128 x 112 KiB) - 1
    assert kv_budget.slot_columns(100 * 2**30, 128, 112 * 2**10, 40960, 65536) == 3875


def test_a_round_of_growing_rows_captures_each_bucket_once():
    """Item 5: rows join one by one while the others grow past a column bucket; every (rows,
    columns) bucket is captured once, every replay reads the slots it was captured on, and the
    tokens are the eager steps' (greedy, so exactly model.generate's)."""
    rng = random.Random(1)
    prompts = [[rng.randrange(3, len(TOK)) for _ in range(rng.randint(3, 40))] for _ in range(8)]
    requests = [req(p, 250 + 4 * i) for i, p in enumerate(prompts)]
    engine = graphed_engine(kv_heads=2)
    outs = generate(engine, requests, stagger=2)
    recorded = engine.static.recorder.recorded
    assert len(recorded) == len(set(recorded)) == engine.stats.graph_captures  # each bucket once
    assert {(r, 256) for r in (2, 3, 4, 6, 8)} | {(8, 512), (2, 512)} <= set(recorded)  # joining, leaving
    assert engine.static.recorder.replays > 20 * len(recorded) and engine.stats.graph_fallbacks == 0
    eager = HFEngine(gqa_model(TOK, 2), TOK, max_batch_size=8, decode="static")
    assert [g.token_ids for g in generate(eager, requests)] == [g.token_ids for g in outs]


def test_an_error_in_a_replay_or_an_eager_step_reaches_the_caller_and_graphs_stay_on(caplog):
    """Item 2: an out-of-memory error raised by a replay, and a plain error of the eager step run
    before a capture, fail the requests with that error; graphs are not turned off for them. Only
    a capture that fails turns them off, with one warning, and the tokens are the eager steps'."""
    engine = graphed_engine()
    engine.static.recorder.replay_error = torch.OutOfMemoryError("CUDA out of memory (stand-in)")
    with pytest.raises(torch.OutOfMemoryError):
        generate(engine, [req([5, 6, 7], 8)])
    assert engine.static.graphs_on and engine.stats.graph_fallbacks == 0

    engine = graphed_engine()
    calls = []

    def broken(module, args):  # the second forward (after the prefill's) is the warm-up of a capture
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a bug in the eager step")

    engine.model.model.register_forward_pre_hook(broken)
    with pytest.raises(RuntimeError, match="a bug in the eager step"):
        generate(engine, [req([5, 6, 7], 8)])
    assert engine.static.graphs_on and engine.stats.graph_fallbacks == 0

    engine = graphed_engine()
    engine.static.recorder.record_error = RuntimeError("operation not permitted when stream is capturing")
    with caplog.at_level("WARNING"):
        outs = generate(engine, [req([5, 6, 7], 8), req([9, 10], 8)])
    assert not engine.static.graphs_on and engine.stats.graph_fallbacks == 1
    assert sum("CUDA graph capture failed" in r.message for r in caplog.records) == 1
    eager = HFEngine(gqa_model(TOK, 2), TOK, decode="static")
    assert [g.token_ids for g in outs] == [
        g.token_ids for g in generate(eager, [req([5, 6, 7], 8), req([9, 10], 8)])
    ]


def test_k_v_bookkeeping_is_one_launch_per_row_whatever_the_layers():
    """Item 6: loading a row's K/V, copying it out, and moving the rows that fill leaving rows'
    slots: one kernel each over every layer (the bench's launch counter), not one per layer."""
    from bench.decode_bench import Launches

    model = build_tiny_model(TOK, hidden=64, layers=6, heads=4, kv_heads=2, intermediate=128)
    engine = HFEngine(model, TOK, decode="static")
    batch = engine.new_batch()
    slots = batch.slots
    slots.reserve(6, 40)
    slots.filled = np.array([30, 20, 10, 25, 5, 15])
    kv = torch.randn(6, 2, 2, 30, 32)
    with Launches() as load:
        slots.load(3, kv)
    with Launches() as out:
        copy = slots.row_kv(3)
    assert torch.equal(copy[:, :, :, :25], kv[:, :, :, :25])
    with Launches() as move:
        slots.move([4, 5], [0, 2])
    assert (load.count, out.count, move.count) == (1, 1, 2)
