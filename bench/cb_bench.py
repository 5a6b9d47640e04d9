"""Benchmark: the project's batching engine against transformers' own continuous batching.

The same tiny model and the same 32 prompts (~1,000 tokens each, all at once, the flat limit of the
engine bench), 64 sampled tokens each at T = 1 with log-probs: (a) HFEngine, the runtime's engine;
(b) transformers' `generate_batch` (paged KV cache, continuous batching, `return_logprobs`).
Prints tokens/s of each and (a) / (b).

    .venv/bin/python bench/cb_bench.py [--prompts 32 --new 64]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from rao_core import interrupts
from rao_core.engines.hf import HFEngine
from rao_core.models.tiny import build_tiny_model
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.policy import GenerationRequest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    model = build_tiny_model(tok, seed=0).eval()
    rng = random.Random(0)
    prompts = [
        [rng.randrange(3, len(tok)) for _ in range(rng.randint(900, 1100))] for _ in range(args.prompts)
    ]
    tokens = args.prompts * args.new

    engine = HFEngine(build_tiny_model(tok, seed=0), tok, cpu_threads=1)  # it switches its model's attention

    async def run_engine() -> tuple[int, float]:
        t = time.perf_counter()
        reqs = [GenerationRequest(p, args.new, (), None, 1.0, i) for i, p in enumerate(prompts)]  # type: ignore[arg-type]
        outs = await asyncio.gather(*[engine.generate(r) for r in reqs])
        return sum(len(o.token_ids) for o in outs), time.perf_counter() - t

    generated, seconds = asyncio.run(run_engine())
    a = generated / seconds
    print(
        f"(a) HFEngine: {generated} tokens in {seconds:.2f}s = {a:.0f} tokens/s (at most {tokens}: eos ends some)"
    )

    gen = GenerationConfig(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=True, temperature=1.0)
    cb = ContinuousBatchingConfig(return_logprobs=True, seed=0)
    model.generate_batch(prompts[:2], generation_config=gen, continuous_batching_config=cb)  # warm up
    t = time.perf_counter()
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
    b_seconds = time.perf_counter() - t
    generated = sum(len(o.generated_tokens) for o in out.values())
    b = generated / b_seconds
    print(f"(b) transformers generate_batch: {generated} tokens in {b_seconds:.2f}s = {b:.0f} tokens/s")
    print(f"HFEngine / generate_batch = {a / b:.1f}x")


if __name__ == "__main__":
    interrupts.run_script(main)
