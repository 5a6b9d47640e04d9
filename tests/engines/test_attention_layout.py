"""Every attention call the engine makes, as CUDA's kernels see it (issue 51, items 1 and 3), on
the CPU: SDPA's output in the memory-efficient kernel's layout, and each call's eligibility for
that kernel by torch's own rules.

On CUDA, SDPA takes the memory-efficient kernel for the engine's calls, and that kernel returns
its output transposed in memory; a `.view` of it raises with grouped-query heads (2 or 8 K/V heads
under 16 query heads, as Qwen3's). Here SDPA is wrapped to return the same values in that layout,
and the engine runs on both decode paths, greedy tokens against model.generate's, and a rollout
round through the `rao` command. The eligibility rules of `can_use_mem_efficient_attention` are
written out in tests/engines/__init__.py (torch's CPU build cannot evaluate them: `torch.backends.cuda
.can_use_efficient_attention` answers False without a GPU); the gpu tier asks torch itself
(tests/engines/test_hf_cuda.py).
"""

from __future__ import annotations

import asyncio
import random

import pyarrow.parquet as pq
import pytest
import torch

from rao_core.engines.hf import HFEngine
from rao_core.models.tokenizer import tiny_tokenizer
from tests.engines import efficient_refusals, gqa_model, record_sdpa, req

TOK = tiny_tokenizer()


@pytest.fixture
def efficient_layout(monkeypatch) -> list[dict]:
    """SDPA returning the memory-efficient kernel's layout; the record of every call."""
    return record_sdpa(monkeypatch, transposed=True)


def two_turns(engine: HFEngine, prompts: list[list[int]], new: int) -> tuple[list, list]:
    """Every prompt's generation, then each conversation's next turn (its K/V reused)."""

    async def go():
        try:
            first = await asyncio.gather(*[engine.generate(req(p, new)) for p in prompts])
            nexts = [p + g.token_ids + [5, 6] for p, g in zip(prompts, first, strict=True)]
            return first, await asyncio.gather(*[engine.generate(req(p, 4)) for p in nexts])
        finally:
            await engine.close()

    return asyncio.run(go())


@pytest.mark.parametrize("kv_heads", [2, 8])
@pytest.mark.parametrize("decode", ["runs", "static"])
def test_every_attention_call_takes_the_memory_efficient_layout_and_kernel(
    efficient_layout, decode, kv_heads
):
    """16 query heads over 2 or 8 K/V heads, prompts of different lengths (prefill with padding,
    reused conversations, decode in runs): greedy tokens equal model.generate's with SDPA's output
    transposed in memory, and every call the engine made is one the memory-efficient kernel takes
    (a mask, so not flash: every call has one, padding and lengths differ per row)."""
    rng = random.Random(kv_heads)
    prompts = [[rng.randrange(3, len(TOK)) for _ in range(rng.randint(3, 60))] for _ in range(6)]
    model = gqa_model(TOK, kv_heads)
    expected = [
        model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False)[0, len(p) :].tolist()
        for p in prompts
    ]
    efficient_layout.clear()  # model.generate's own calls are stock SDPA's
    engine = HFEngine(gqa_model(TOK, kv_heads), TOK, decode=decode)
    outs, again = two_turns(engine, prompts, 10)
    assert [g.token_ids for g in outs] == expected
    assert all(g.finish_reason == "length" for g in again) and engine.stats.prefix_hits == len(prompts)
    decodes = [
        c for c in efficient_layout if c["mask"].shape[2] == 1
    ]  # one token's mask, shared by its heads
    prefills = [c for c in efficient_layout if c["mask"].shape[2] > 1]
    assert prefills and decodes
    for call in efficient_layout:
        assert call["mask"] is not None and efficient_refusals(call) == [], efficient_refusals(call)
    # the rule refuses the call the prefill used to make (mask + grouped heads: the math kernel's)
    q, kv = torch.randn(2, 16, 5, 32), torch.randn(2, kv_heads, 7, 32)
    old = dict(q=q, k=kv, v=kv, mask=torch.ones(2, 1, 5, 7, dtype=torch.bool), gqa=True)
    assert "enable_gqa" in efficient_refusals(old) and any(
        "heads must match" in w for w in efficient_refusals(old)
    )


@pytest.mark.parametrize("decode", ["runs", "static"])
def test_a_rollout_with_that_layout_has_no_engine_failure(efficient_layout, tmp_path, decode):
    """The reproduction of issue 51, item 1: `rao rollout` in process, one task, two trees, the
    shipped model (4 query heads over 2 K/V heads), SDPA's output transposed: no node ends with
    an infrastructure error, and every node sampled tokens."""
    from flows.cli import main

    sets = [f"runs_dir={tmp_path}", "run_name=layout", "policy.engine_processes=0", f"policy.decode={decode}",
            "rollout.num_tasks=1", "rollout.group_size=2", "agent.max_steps=3", "tracking.enabled=false"]  # fmt: skip
    assert main(["rollout", "--no-progress", *[a for s in sets for a in ("--set", s)]]) == 0
    nodes = pq.read_table(tmp_path / "layout" / "rollouts" / "round=0" / "nodes.parquet").to_pylist()
    assert nodes and not [n["finish_message"] for n in nodes if n["status"] == "infra_error"]
    assert all(n["action_tokens"] > 0 for n in nodes)
    assert {c["mask"].shape[2] > 1 for c in efficient_layout} == {True, False}  # prefills and decode steps
