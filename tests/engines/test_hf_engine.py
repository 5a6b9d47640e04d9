"""HFEngine: batched = one-at-a-time = model.generate under greedy decoding; log-probs match a full
forward pass; stop strings, eos, length and context limits; batching; exact token storage through a
real TreeRun; weight reload."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from rao_core.agent.prompts import ChatFraming
from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.engines.hf import HFEngine
from rao_core.engines.hf_batch import completes_stop, row_runs, stop_index
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.policy import Generation, GenerationRequest, Policy
from tests.agent.test_runtime import NoteEnv
from tests.engines import chain_model, req, small_model

TOK = tiny_tokenizer()


@pytest.fixture(scope="module")
def ref():
    """The reference: same weights as every engine's model, stock attention, never given to an
    engine (HFEngine switches its model's attention to the same-math "sdpa_gqa")."""
    model = small_model(TOK)
    assert model.config._attn_implementation == "sdpa"
    return model


@pytest.fixture(params=["runs", "static"])
def decode(request) -> str:
    """Both decode paths: the CPU's runs of rows, and the fixed-shape step CUDA takes."""
    return request.param


def prompts(n: int = 12, seed: int = 0) -> list[list[int]]:
    """Prompts of very different lengths, so left padding and cache merging both matter."""
    rng = random.Random(seed)
    return [[rng.randrange(3, len(TOK)) for _ in range(rng.randint(3, 90))] for _ in range(n)]


def run(coro_fn, engine: Policy):
    async def main():
        try:
            return await coro_fn()
        finally:
            await engine.close()

    return asyncio.run(main())


def test_greedy_batched_equals_single_equals_generate(ref, decode):
    engine = HFEngine(small_model(TOK), TOK, decode=decode)
    ps = prompts()

    async def both():
        batched = await asyncio.gather(*[engine.generate(req(p, 12)) for p in ps])
        single = [await engine.generate(req(p, 12)) for p in ps]
        return batched, single

    batched, single = run(both, engine)
    for p, a, b in zip(ps, batched, single, strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
        expected = ref.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p) :]
        assert a.token_ids == expected.tolist()
        assert a.text == TOK.decode(a.token_ids, skip_special_tokens=True)
    assert max(engine.stats.batch_sizes) == len(ps)


def test_staggered_arrivals_join_the_running_batch(ref, decode):
    """Requests arriving while others decode are merged into the running batch (continuous
    batching) and still decode exactly as alone."""
    engine = HFEngine(small_model(TOK), TOK, max_batch_size=5, decode=decode)
    ps = prompts(10, seed=1)

    async def staggered(i, p):
        # Arrive after the engine has run i forward passes: gated on progress, not on wall-clock,
        # so a fast or a loaded machine sees the same joins (request 0 still decodes 24 tokens).
        while engine.stats.batches < i:
            await asyncio.sleep(0.0005)
        return await engine.generate(req(p, 24 - i))

    outs = run(lambda: asyncio.gather(*[staggered(i, p) for i, p in enumerate(ps)]), engine)
    for i, (p, a) in enumerate(zip(ps, outs, strict=True)):
        expected = ref.generate(torch.tensor([p]), max_new_tokens=24 - i, do_sample=False)[0, len(p) :]
        assert a.token_ids == expected.tolist()
    assert max(engine.stats.batch_sizes) == 5  # max_batch_size is respected
    assert engine.stats.requests == 10 and engine.stats.tokens_generated == sum(
        len(o.token_ids) for o in outs
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_full_forward(ref, temperature, decode):
    engine = HFEngine(small_model(TOK), TOK, seed=3, decode=decode)
    ps = prompts(6, seed=2)
    outs = run(lambda: asyncio.gather(*[engine.generate(req(p, 10, temperature)) for p in ps]), engine)
    t = temperature or 1.0  # greedy reports the T=1 log-softmax
    for p, g in zip(ps, outs, strict=True):
        assert len(g.logprobs) == len(g.token_ids) > 0
        with torch.no_grad():
            logits = ref(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1].float()
        expected = torch.log_softmax(logits / t, -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.allclose(expected, torch.tensor(g.logprobs), atol=1e-4)


def test_sampling_is_seeded_and_mixed_temperatures_batch(decode):
    ps = prompts(4, seed=4)
    model = small_model(TOK)

    def sample(seed):
        engine = HFEngine(model, TOK, seed=seed, decode=decode)
        reqs = [req(p, 8, temperature=1.0 if i % 2 else 0.0) for i, p in enumerate(ps)]
        return run(lambda: asyncio.gather(*[engine.generate(r) for r in reqs]), engine)

    a, b = sample(0), sample(0)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    greedy = HFEngine(model, TOK, decode=decode)
    ref = run(lambda: asyncio.gather(*[greedy.generate(req(p, 8)) for p in ps[::2]]), greedy)
    assert [g.token_ids for g in a[::2]] == [g.token_ids for g in ref]  # greedy rows unaffected


def test_next_turn_reuses_the_conversation(ref, decode):
    """A prompt that extends an earlier prompt + reply prefills only the appended tokens, mixed in
    one prefill with a fresh prompt, and decodes exactly as from scratch."""
    engine = HFEngine(small_model(TOK), TOK, decode=decode)
    ps, obs = prompts(4, seed=6), TOK.encode("<|im_end|>\n<|im_start|>user\nError: no cell<|im_end|>\n")

    async def turns():
        first = await asyncio.gather(*[engine.generate(req(p, 6)) for p in ps])
        nexts = [p + g.token_ids + obs for p, g in zip(ps, first, strict=True)][::-1] + prompts(1, seed=7)
        return nexts, await asyncio.gather(*[engine.generate(req(n, 6, temperature=0.7)) for n in nexts])

    nexts, second = run(turns, engine)
    assert engine.stats.prefix_hits == 4
    assert engine.stats.prefill_tokens == sum(map(len, ps)) + 4 * (len(obs) + 1) + len(nexts[-1])
    for n, g in zip(nexts, second, strict=True):
        with torch.no_grad():
            logits = ref(torch.tensor([n + g.token_ids])).logits[0, len(n) - 1 : -1]
        expected = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.allclose(expected, torch.tensor(g.logprobs), atol=1e-4)


def test_shared_beginnings_are_computed_once(ref, decode):
    """New prompts sharing a system prompt: one pass over the shared part for a wave that arrives
    together, and a copy from a stored conversation for a prompt that arrives later."""
    engine = HFEngine(small_model(TOK), TOK, decode=decode)
    system = prompts(1, seed=10)[0] + prompts(1, seed=11)[0]  # > 32 tokens
    tails = prompts(4, seed=12)
    wave, late = [system + t for t in tails[:3]], system + tails[3]

    async def go():
        first = await asyncio.gather(*[engine.generate(req(p, 5)) for p in wave])
        return first + [await engine.generate(req(late, 5))]

    outs = run(go, engine)
    assert engine.stats.prefill_tokens == len(system) + sum(map(len, tails))
    for p, g in zip([*wave, late], outs, strict=True):
        expected = ref.generate(torch.tensor([p]), max_new_tokens=5, do_sample=False)[0, len(p) :]
        assert g.token_ids == expected.tolist()


def test_stop_cutting_on_token_streams():
    ids = TOK.encode("<thought>x</thought>\n<python>\nprint(1)\n</python>\nmore")
    k = stop_index(ids, TOK.decode, ["</python>"])
    assert TOK.decode(ids[:k]).endswith("</python>") and "</python>" not in TOK.decode(ids[: k - 1])
    k2 = stop_index(ids, TOK.decode, ["</py"])  # completed inside the 'python' token: keep it
    assert TOK.decode(ids[:k2]).endswith("</python") and k2 == k - 1
    assert stop_index(ids, TOK.decode, ["nothing"]) is None
    assert stop_index(ids, TOK.decode, ["more", "</thought>"]) == len(TOK.encode("<thought>x</thought>"))
    assert not completes_stop(ids, TOK.decode, [])
    # a stop string split over many single-character tokens is still found in the tail window
    chars = [TOK.convert_tokens_to_ids(c) for c in "abcabc"]
    assert stop_index(chars, TOK.decode, ["cab"]) == 5


def test_stop_strings_eos_and_limits_end_to_end(decode):
    model, chain = chain_model(TOK)  # continues "ok</python> tailwords" token by token
    engine = HFEngine(model, TOK, context_limit=len(chain) + 3, decode=decode)
    prompt = chain[:1]  # "o": the model continues "k</python> tailwords"

    async def cases():
        return await asyncio.gather(
            engine.generate(req(prompt, 10, stop=["</python>"])),
            engine.generate(req(prompt, 10, 0.7, stop=["on> t", "zzz"])),
            engine.generate(req(prompt, 3)),
            engine.generate(req(prompt, 50)),
            engine.generate(req(chain + [1, 1, 1], 5)),
        )

    stop, mid, length, context, full = run(cases, engine)
    assert stop.token_ids == chain[1:5] and stop.text == "k</python>" and stop.finish_reason == "stop"
    assert mid.token_ids == chain[1:7] and mid.text == "k</python> t" and mid.finish_reason == "stop"
    assert length.token_ids == chain[1:4] and length.finish_reason == "length"
    assert len(prompt) + len(context.token_ids) == engine.context_limit and context.finish_reason == "context"
    assert full == Generation("", [], [], "context")


def test_eos_stops_and_is_kept(decode):
    model, chain = chain_model(TOK, "ok words")
    with torch.no_grad():  # make "s" be followed by eos
        emb = model.model.embed_tokens.weight
        model.lm_head.weight[TOK.eos_token_id] = emb[chain[-1]] / emb[chain[-1]].norm() * 50
    engine = HFEngine(model, TOK, decode=decode)
    g = run(lambda: engine.generate(req(chain[:1], 20)), engine)
    assert g.token_ids == chain[1:] + [TOK.eos_token_id] and g.finish_reason == "stop"
    assert g.text == "k words"


class Recorder(Policy):
    """Wraps a policy and records what it returned to which node."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.calls = inner, []

    async def generate(self, request: GenerationRequest) -> Generation:
        gen = await self.inner.generate(request)
        self.calls.append((request.node.node_id, list(request.prompt_ids), gen))
        return gen


def test_tree_run_stores_exactly_the_sampled_ids(decode):
    """Real trees with the untrained model: garbage replies become error observations, and each
    record's action tokens and log-probs are exactly what the engine returned, in order."""
    engine = HFEngine(small_model(TOK), TOK, decode=decode)
    policy = Recorder(engine)
    chat = ChatFraming(TOK)
    cfg = AgentConfig(max_steps=3, max_new_tokens=24, cell_timeout_s=5.0, tree_timeout_s=60.0)
    specs = [TreeSpec("t", i, NoteEnv(f"say ok {i}")) for i in range(3)]
    trees = run(lambda: run_trees(specs, policy, chat, cfg, SandboxConfig(), 1.0), engine)
    assert max(engine.stats.batch_sizes) > 1  # the three roots were batched
    assert engine.stats.prefix_hits == 6  # turns 2 and 3 of each root reused the conversation
    records = [r for t in trees for r in t.records]
    assert len(records) == 3
    for rec in records:
        mine = [(p, g) for node, p, g in policy.calls if node == rec.node_id]
        assert len(mine) == rec.turns == 3
        actions = [t for t, m in zip(rec.token_ids, rec.action_mask, strict=True) if m]
        assert actions == [t for _, g in mine for t in g.token_ids]
        lps = [lp for lp, m in zip(rec.logprobs, rec.action_mask, strict=True) if m]
        assert lps == [lp for _, g in mine for lp in g.logprobs]
        for p, g in mine:  # each prompt is a prefix of the stored sequence, followed by the reply
            assert rec.token_ids[len(p) : len(p) + len(g.token_ids)] == g.token_ids
            assert rec.token_ids[: len(p)] == p


def test_cancelled_requests_leave_the_batch(decode):
    engine = HFEngine(small_model(TOK), TOK, decode=decode)

    async def go():
        task = asyncio.ensure_future(engine.generate(req(prompts(1)[0], 10_000)))
        while engine.stats.batches < 2:  # prefilled and decoding
            await asyncio.sleep(0.001)
        task.cancel()
        st = engine._states[asyncio.get_running_loop()]
        while st.batch.seqs or st.pending or st.wake.is_set():  # until the runner goes idle
            await asyncio.sleep(0.001)
        assert engine._inflight == 0  # the cancelled row left the batch: nothing left to decode
        return await engine.generate(req(prompts(1)[0], 3))

    assert len(run(go, engine).token_ids) == 3


def test_rows_of_very_different_lengths_decode_in_runs_and_after_a_sort(ref):
    """Long and short prompts alternate in slot order, so one attention call over the longest
    row's columns would read mostly padding: the engine sorts the rows by length (a permutation of
    the K/V slots) and attends in runs, and every row still decodes exactly as model.generate."""
    engine = HFEngine(small_model(TOK), TOK)
    rng = random.Random(5)
    ps = [[rng.randrange(3, len(TOK)) for _ in range(300 if i % 2 else 4)] for i in range(8)]
    outs = run(lambda: asyncio.gather(*[engine.generate(req(p, 10)) for p in ps]), engine)
    assert engine.stats.sorts >= 1
    for p, g in zip(ps, outs, strict=True):
        expected = ref.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False)[0, len(p) :]
        assert g.token_ids == expected.tolist()


def test_row_runs_cover_every_row_once_and_count_their_padding():
    """Against a plain reference on random lengths: contiguous runs that partition the rows, each
    over its longest row's columns, and the padding they read."""
    rng = random.Random(0)
    for _ in range(300):
        lens = [rng.choice([rng.randint(1, 40), rng.randint(1, 3000)]) for _ in range(rng.randint(1, 70))]
        cost = rng.choice([0, 64, 512, 10**9])
        runs, waste = row_runs(lens, cost)
        assert runs[0][0] == 0 and runs[-1][1] == len(lens)
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:], strict=False))
        assert all(n == max(lens[i:j]) for i, j, n in runs)
        assert waste == sum(n - x for i, j, n in runs for x in lens[i:j])
        if cost == 10**9:
            assert len(runs) == 1
        if cost == 0:  # every change of length starts a run
            assert len(runs) == 1 + sum(a != b for a, b in zip(lens, lens[1:], strict=False))


def test_sliding_window_models_are_refused_up_front():
    model = small_model(TOK)
    model.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(NotImplementedError, match="full-attention layers only"):
        HFEngine(model, TOK)
