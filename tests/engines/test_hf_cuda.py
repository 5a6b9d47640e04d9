"""The transformers engine on CUDA (gpu tier: runs where torch sees a GPU, skipped elsewhere):
greedy tokens equal model.generate's on every decode path, the CUDA graphs are captured and
replay exactly what eager steps compute, in bf16 too, and seeded sampling repeats."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from rao_core.engines.hf import HFEngine
from rao_core.models.tokenizer import tiny_tokenizer
from tests.engines import req, small_model

pytestmark = pytest.mark.gpu
TOK = tiny_tokenizer()


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, len(TOK)) for _ in range(rng.randint(3, 300))] for _ in range(n)]


def generate_all(engine: HFEngine, ps: list[list[int]], new: int, temperature: float = 0.0) -> list:
    async def go():
        try:
            return await asyncio.gather(*[engine.generate(req(p, new, temperature)) for p in ps])
        finally:
            await engine.close()

    return asyncio.run(go())


@pytest.mark.parametrize(("decode", "graphs"), [("static", True), ("static", False), ("runs", False)])
def test_greedy_on_cuda_equals_generate(decode, graphs):
    ref = small_model(TOK).cuda()
    engine = HFEngine(small_model(TOK).cuda(), TOK, decode=decode, cuda_graphs=graphs)
    assert engine.device.type == "cuda"
    ps = prompts(24, seed=0)
    outs = generate_all(engine, ps, 16)
    for p, g in zip(ps, outs, strict=True):
        expected = ref.generate(torch.tensor([p], device="cuda"), max_new_tokens=16, do_sample=False)
        assert g.token_ids == expected[0, len(p) :].tolist()
    if decode == "static":
        assert engine.static.graphs_on == graphs  # no silent fallback to eager steps
        assert bool(engine.static.graphs) == graphs
        assert engine.stats.host_reads == engine.stats.batches  # one read per forward


def test_graphs_replay_what_eager_steps_compute_in_bf16():
    """The same bf16 model and requests, sampled at T = 1: graph replays and eager steps give the
    same tokens and log-probs (the graph records the eager step's kernels)."""
    model = small_model(TOK).cuda().to(torch.bfloat16)
    ps = prompts(40, seed=1)
    outs = {
        graphs: generate_all(HFEngine(model, TOK, decode="static", cuda_graphs=graphs, seed=7), ps, 24, 1.0)
        for graphs in (True, False)
    }
    assert [g.token_ids for g in outs[True]] == [g.token_ids for g in outs[False]]
    assert [g.logprobs for g in outs[True]] == [g.logprobs for g in outs[False]]


def test_one_decode_step_reads_the_device_once():
    """torch's own sync detector over one static step of 64 rows: one synchronization (the read of
    the sampled tokens)."""
    from bench.decode_bench import cuda_syncs_of_one_step

    engine = HFEngine(small_model(TOK).cuda(), TOK, decode="static")
    assert cuda_syncs_of_one_step(engine, 64) <= 1
