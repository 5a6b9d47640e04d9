"""The fixed-shape decode path (hf_static.py): its sampler against the distribution it claims,
batch-independent seeded draws, its buckets, the stop-string shortcut against the plain check, and
one step's work and host reads whatever the rows in flight (what bench/decode_bench.py prints)."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
import torch

from rao_core.engines.hf import HFEngine
from rao_core.engines.hf_batch import StopCheck, completes_stop
from rao_core.engines.hf_static import column_bucket, request_key, row_bucket, sample_rows, uniform
from rao_core.models.tokenizer import tiny_tokenizer
from tests.engines import req, small_model

TOK = tiny_tokenizer()


def test_sampled_frequencies_follow_softmax_over_temperature():
    """40,000 draws from one row's distribution (each its own key) against softmax(logits / T),
    by a chi-square test; a token at -inf is never drawn; greedy rows take the argmax."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(12, generator=gen) * 2
    logits[5] = -math.inf
    n, temp = 40_000, 0.7
    keys = torch.tensor([request_key(i, random.Random(0)) for i in range(n)])
    tokens, logps = sample_rows(logits.expand(n, -1), torch.full((n,), temp), keys, torch.zeros(n).long())
    probs = torch.softmax(logits / temp, -1)
    counts = torch.bincount(tokens, minlength=12).double()
    assert counts[5] == 0
    live = probs > 0
    chi2 = float((((counts - n * probs) ** 2)[live] / (n * probs[live])).sum())
    assert chi2 < 35.0, chi2  # 10 degrees of freedom: P(chi2 > 35) < 1e-4
    assert torch.allclose(logps, torch.log(probs[tokens]).float(), atol=1e-5)
    greedy, greedy_lp = sample_rows(logits[None], torch.zeros(1), keys[:1], torch.zeros(1).long())
    assert int(greedy) == int(logits.argmax()) and torch.allclose(
        greedy_lp, torch.log_softmax(logits, -1).max()
    )


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
