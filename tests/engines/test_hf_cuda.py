"""The transformers engine on CUDA (gpu tier: runs where torch sees a GPU, skipped elsewhere), at
the shapes the real models have: 16 query heads over 2 or 8 K/V heads (the shipped tiny models:
4 over 2; Qwen3-0.6B: 16 over 8). Greedy tokens equal model.generate's on every decode path; the
static path captures its CUDA graphs, keeps them on to the end with no fallback, and its bf16
log-probs equal a plain forward's; every attention call is one torch runs on its memory-efficient
kernel (torch's own rule); one read of the device per step."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random

import pytest
import torch
from torch.backends.cuda import SDPAParams, can_use_efficient_attention

from rao_core.engines.hf import HFEngine
from rao_core.models.tokenizer import tiny_tokenizer
from tests.engines import efficient_refusals, gqa_model, record_sdpa, req, small_model

pytestmark = pytest.mark.gpu
TOK = tiny_tokenizer()
KV_HEADS = [2, 8]


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, len(TOK)) for _ in range(rng.randint(3, 300))] for _ in range(n)]


def generate_all(
    engine: HFEngine, ps: list[list[int]], new: int, temperature: float = 0.0, seed=None
) -> list:
    async def go():
        try:
            requests = [req(p, new, temperature) for p in ps]
            if seed is not None:  # seeded requests, as the runtime sends them
                requests = [dataclasses.replace(r, seed=seed + i) for i, r in enumerate(requests)]
            return await asyncio.gather(*[engine.generate(r) for r in requests])
        finally:
            await engine.close()

    return asyncio.run(go())


def no_fallback(engine: HFEngine, caplog) -> None:
    """Graphs captured, still on at the end, none failed, no warning said so."""
    assert engine.static.graphs_on and engine.stats.graph_captures > 0 and engine.stats.graph_fallbacks == 0
    assert not [r for r in caplog.records if "CUDA graph capture failed" in r.message]


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@pytest.mark.parametrize(("decode", "graphs"), [("static", True), ("static", False), ("runs", False)])
def test_greedy_on_cuda_equals_generate(decode, graphs, kv_heads, caplog):
    ref = gqa_model(TOK, kv_heads).cuda()
    engine = HFEngine(gqa_model(TOK, kv_heads).cuda(), TOK, decode=decode, cuda_graphs=graphs)
    assert engine.device.type == "cuda"
    ps = prompts(24, seed=0)
    with caplog.at_level(logging.WARNING):
        outs = generate_all(engine, ps, 16)
    for p, g in zip(ps, outs, strict=True):
        expected = ref.generate(torch.tensor([p], device="cuda"), max_new_tokens=16, do_sample=False)
        assert g.token_ids == expected[0, len(p) :].tolist()
    if decode == "static":
        assert engine.slot_shape is not None  # fixed slots, sized from the GPU's free memory
        assert engine.stats.host_reads == engine.stats.batches  # one read per forward
        if graphs:
            no_fallback(engine, caplog)
        else:
            assert engine.stats.graph_captures == 0


@pytest.mark.parametrize("kv_heads", KV_HEADS)
def test_bf16_log_probs_with_graphs_equal_a_plain_forward(kv_heads, caplog):
    """A bf16 model sampled at T = 1 on the static path with graphs: each token's log-prob equals
    the log-softmax of a plain forward (stock SDPA) over prompt + tokens, to bf16's precision."""
    model = gqa_model(TOK, kv_heads).cuda().to(torch.bfloat16)
    ps = prompts(16, seed=2)
    engine = HFEngine(model, TOK, decode="static", cuda_graphs=True)
    with caplog.at_level(logging.WARNING):
        outs = generate_all(engine, ps, 24, temperature=1.0, seed=5)
    no_fallback(engine, caplog)
    with torch.no_grad():
        for p, g in zip(ps, outs, strict=True):
            ids = torch.tensor([p + g.token_ids], device="cuda")
            logp = torch.log_softmax(model(ids).logits[0, len(p) - 1 : -1].double(), -1)
            ref = logp.gather(1, torch.tensor(g.token_ids, device="cuda")[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(g.logprobs, device="cuda"), ref, atol=0.05, rtol=0.02)


def test_graphs_replay_what_eager_steps_compute_in_bf16(caplog):
    """The same bf16 model and requests, sampled at T = 1: graph replays and eager steps give the
    same tokens and log-probs (the graph records the eager step's kernels)."""
    model = gqa_model(TOK, 8).cuda().to(torch.bfloat16)
    ps = prompts(40, seed=1)
    outs = {}
    for graphs in (True, False):
        engine = HFEngine(model, TOK, decode="static", cuda_graphs=graphs, seed=7)
        with caplog.at_level(logging.WARNING):
            outs[graphs] = generate_all(engine, ps, 24, 1.0)
        if graphs:
            no_fallback(engine, caplog)
    assert [g.token_ids for g in outs[True]] == [g.token_ids for g in outs[False]]
    assert [g.logprobs for g in outs[True]] == [g.logprobs for g in outs[False]]


@pytest.mark.parametrize("kv_heads", KV_HEADS)
def test_every_attention_call_is_one_torch_runs_on_its_memory_efficient_kernel(kv_heads, monkeypatch):
    """Prefills (padded, with reused K/V) and decode steps in bf16: torch's own rule
    (can_use_efficient_attention) accepts every call the engine makes, and so does the rule the
    CPU suite checks them with (tests/engines/__init__.py)."""
    calls = record_sdpa(monkeypatch)
    engine = HFEngine(
        gqa_model(TOK, kv_heads).cuda().to(torch.bfloat16), TOK, decode="static", cuda_graphs=False
    )
    generate_all(engine, prompts(8, seed=3), 8)
    assert {c["mask"].shape[2] > 1 for c in calls} == {True, False}  # prefills and decode steps
    for c in calls:
        params = SDPAParams(c["q"], c["k"], c["v"], c["mask"], 0.0, False, c["gqa"])
        assert can_use_efficient_attention(params, True), [tuple(c[n].shape) for n in "qkv"]
        assert efficient_refusals(c) == []


def test_one_decode_step_reads_the_device_once():
    """torch's own sync detector over one static step of 64 rows: one synchronization (the read of
    the sampled tokens)."""
    from bench.decode_bench import cuda_syncs_of_one_step

    engine = HFEngine(small_model(TOK).cuda(), TOK, decode="static")
    assert cuda_syncs_of_one_step(engine, 64) <= 1
