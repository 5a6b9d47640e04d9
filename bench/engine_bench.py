"""Benchmark: do the engines turn many concurrent agent nodes into efficient batches?

The same tiny untrained model (the bootstrap config, 0.85M parameters) runs three ways:
  (a) engine: N real TextCraft trees at once through rao_core.agent.tree.TreeRun, the engine as
      the policy (the model writes garbage, so every turn ends in an error observation that is
      appended to the prompt: growing prompts, several turns per node, sandboxes running); with
      `--engines hf,vllm` once through each engine (vLLM: the managed server of .venv-vllm, started
      before the clock runs), the same trees and seeds;
  (b) one at a time: the first few of those trees again, one after another (one request in flight;
      timed while waiting for replies only, so sandbox time does not count against it);
  (c) flat: one lockstep batched decode of N sequences with a KV cache and nothing else (the
      throughput limit of batching N sequences on this machine).
Tokens/s counts sampled tokens only. Goals: (a) >= 5x (b), and (a) >= 0.7x (c); vLLM >= 3x hf.

    .venv/bin/python bench/engine_bench.py [--engines hf,vllm] [--trees 32 --turns 4 --new 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

from rao_core import interrupts
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.engines.hf import HFEngine
from rao_core.envs.args import TextCraftArgs
from rao_core.envs.textcraft import env_from_task, generate_world, make_tasks
from rao_core.models.tiny import build_tiny_model
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.policy import Generation, GenerationRequest, Policy


class Recorder(Policy):
    """Keeps the requests, and the seconds spent waiting for replies."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.requests, self.seconds, self.tokens = inner, [], 0.0, 0
        self.first, self.last = float("inf"), 0.0

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        start = time.perf_counter()
        self.first = min(self.first, start)
        try:
            reply = await self.inner.generate(request)
            self.tokens += len(reply.token_ids or [])
            return reply
        finally:
            self.last = time.perf_counter()
            self.seconds += self.last - start


def bench_trees(model, tok, n_trees: int, turns: int, new: int, concurrent: bool, engine=None, **engine_kw):
    """Real TextCraft trees with the engine as policy: all at once, or one tree after another."""
    world = generate_world(TextCraftArgs())
    tasks = [t for t in make_tasks(world, TextCraftArgs()) if t.difficulty == "medium"]
    cfg = AgentConfig(max_steps=turns, max_new_tokens=new, max_context_tokens=4096, tree_timeout_s=900)
    engine = engine or HFEngine(model, tok, **engine_kw)
    policy, chat = Recorder(engine), ChatFraming(tok)
    specs = [TreeSpec(t.task_id, 0, env_from_task(world, t)) for t in tasks[:n_trees]]

    async def go() -> float:
        start = time.perf_counter()
        await run_trees(
            specs, policy, chat, cfg, SandboxConfig(), 1.0, concurrency=len(specs) if concurrent else 1
        )
        seconds = time.perf_counter() - start
        await engine.close()
        return seconds

    return asyncio.run(go()), policy, engine


@torch.inference_mode()
def flat(model, prompts: list[list[int]], steps: int) -> tuple[float, float, int]:
    """Left-padded prefill, then `steps` lockstep sampling steps for every row: no stops, no queue.
    Returns (total seconds, of which prefill, tokens)."""
    n = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), n), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, n - len(p) :], mask[i, n - len(p) :] = torch.tensor(p), 1
    start = time.perf_counter()
    cache, pos = DynamicCache(config=model.config), (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, logits_to_keep=1)
    prefill = time.perf_counter() - start
    for _ in range(steps - 1):
        tok = torch.multinomial(torch.softmax(out.logits[:, -1].float(), -1), 1)
        mask = torch.nn.functional.pad(mask, (0, 1), value=1)
        pos = pos[:, -1:] + 1
        out = model(
            input_ids=tok, attention_mask=mask, position_ids=pos, past_key_values=cache, logits_to_keep=1
        )
    return time.perf_counter() - start, prefill, steps * len(prompts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", type=int, default=32, help="concurrent trees (= concurrent nodes here)")
    ap.add_argument("--turns", type=int, default=4, help="model turns per node")
    ap.add_argument("--new", type=int, default=64, help="max new tokens per turn")
    ap.add_argument("--serial", type=int, default=4, help="trees run one after another in (b)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the decoding thread")
    ap.add_argument("--prefix-cache-tokens", type=int, default=65536, help="0 turns K/V reuse off")
    ap.add_argument("--engines", default="hf", help="hf, or hf,vllm: (a) through each (vLLM: make vllm)")
    args = ap.parse_args()
    kw = dict(cpu_threads=args.threads, prefix_cache_tokens=args.prefix_cache_tokens)
    hf_logging.disable_progress_bar()
    tok = tiny_tokenizer()
    model = build_tiny_model(tok, seed=0)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: tiny Qwen3, {params / 1e6:.2f}M parameters, decoding threads {args.threads}, "
        f"prefix cache {args.prefix_cache_tokens} tokens, load average {os.getloadavg()[0]:.1f}"
    )

    seconds, rec, engine = bench_trees(model, tok, args.trees, args.turns, args.new, True, **kw)
    st, sizes = engine.stats, engine.stats.batch_sizes
    prompt_lens = [len(r.prompt_ids) for r in rec.requests]
    busy = rec.last - rec.first
    a = st.tokens_generated / busy
    print(
        f"(a) engine, {args.trees} concurrent trees x {args.turns} turns: {st.tokens_generated} tokens in "
        f"{busy:.2f}s from first request to last reply = {a:.0f} tokens/s ({seconds:.2f}s wall clock "
        f"with sandbox starts: {st.tokens_generated / seconds:.0f} tokens/s)"
    )
    print(
        f"    {st.requests} requests, prompts {min(prompt_lens)}-{max(prompt_lens)} tokens, "
        f"{st.prefill_tokens} of {st.prompt_tokens} prompt tokens computed ({st.prefix_hits} reused "
        f"conversations); {len(sizes)} forward passes, mean batch {sum(sizes) / len(sizes):.1f}, "
        f"max {max(sizes)}; {st.prefill_seconds:.1f}s prefill, {st.decode_seconds:.1f}s decode"
    )

    _, rec_b, engine_b = bench_trees(model, tok, args.serial, args.turns, args.new, False, **kw)
    b = engine_b.stats.tokens_generated / rec_b.seconds
    print(
        f"(b) one at a time: {args.serial} trees in turn, {engine_b.stats.tokens_generated} tokens in "
        f"{rec_b.seconds:.2f}s of generation (waiting for replies only) = {b:.0f} tokens/s"
    )

    firsts = [r.prompt_ids for r in rec.requests[: args.trees]]
    with ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(args.threads,)) as pool:
        seconds, prefill, tokens = pool.submit(flat, model, firsts, args.turns * args.new).result()
    c = tokens / seconds
    print(
        f"(c) flat batch: {len(firsts)} sequences x {args.turns * args.new} tokens in {seconds:.2f}s = "
        f"{c:.0f} tokens/s ({prefill:.1f}s of it prefill; decode alone "
        f"{tokens / (seconds - prefill):.0f} tokens/s)"
    )
    print(f"engine / one-at-a-time = {a / b:.1f}x (goal >= 5x); engine / flat = {a / c:.2f}x (goal >= 0.7x)")
    if "vllm" in args.engines.split(","):
        v = vllm_run(model, tok, args)
        print(f"vllm / hf = {v / a:.1f}x (goal >= 3x); vllm / flat = {v / c:.1f}x")


def vllm_run(model, tok, args) -> float:
    """(a) again through the managed vLLM server (its own process and cores); returns tokens/s."""
    import tempfile
    from pathlib import Path

    from rao_core.config import VLLMPolicy
    from rao_core.engines.scope import engine_scope
    from rao_core.engines.vllm import VLLMEngine
    from rao_core.models.tiny import build_tiny_model, save_checkpoint

    with tempfile.TemporaryDirectory() as tmp, engine_scope(Path(tmp)):
        save_checkpoint(model, tok, Path(tmp) / "model")
        t0 = time.perf_counter()
        engine = VLLMEngine.serving(VLLMPolicy(), Path(tmp) / "model", tok, 4096)
        server = engine.server
        print(
            f"vllm server healthy and verified after {time.perf_counter() - t0:.1f}s "
            f"(probe max |served - checkpoint| log-prob {server.probe_diff:.1e})"
        )
        seconds, rec, _ = bench_trees(model, tok, args.trees, args.turns, args.new, True, engine=engine)
        save_checkpoint(build_tiny_model(tok, seed=1), tok, Path(tmp) / "next")  # new weights
        t0 = time.perf_counter()
        server.ensure(Path(tmp) / "next")
        load = server.reloads[-1]
        print(
            f"new weights into the running server: reload {load['seconds']:.3f}s, with the probe check "
            f"{time.perf_counter() - t0:.2f}s (probe max |diff| {load['probe_max_diff']:.1e})"
        )
    generated = rec.tokens
    busy = rec.last - rec.first
    print(
        f"(a) vllm, {args.trees} concurrent trees x {args.turns} turns: {generated} tokens in {busy:.2f}s "
        f"from first request to last reply = {generated / busy:.0f} tokens/s ({len(rec.requests)} requests, "
        f"{seconds:.2f}s wall clock)"
    )
    return generated / busy


if __name__ == "__main__":
    interrupts.run_script(main)
