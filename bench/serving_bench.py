"""Benchmark: the engines as servers of short agent turns, without the agent runtime around them.

64 requests of 32 new tokens after a ~900-token prompt that is already cached (a node's next turn),
at 1, 16 and 64 requests in flight, seeded (as every rollout request is) or not, through the
transformers engine and through the managed vLLM server (make vllm). Prints tokens/s per cell and
vllm / hf per cell.

    .venv/bin/python bench/serving_bench.py [--model rao_core/models/checkpoints/small-warmstart]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from rao_core import interrupts
from rao_core.config import VLLMPolicy
from rao_core.engines.hf import HFEngine
from rao_core.engines.scope import engine_scope
from rao_core.engines.vllm import VLLMEngine
from rao_core.models.tokenizer import load_tokenizer
from rao_core.policy import GenerationRequest, Policy

N, NEW = 64, 32


async def cell(engine: Policy, conc: int, seeded: bool, vocab: int) -> float:
    base = [5 + (j * 7) % (vocab - 10) for j in range(900)]
    gate = asyncio.Semaphore(conc)

    async def one(i: int) -> None:
        async with gate:
            await engine.generate(
                GenerationRequest(base + [3 + i % 400], NEW, ("</python>",), None, 1.0, i if seeded else None)
            )  # type: ignore[arg-type]

    await asyncio.gather(*[one(i) for i in range(4)])  # the shared prompt is now cached
    t = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(N)])
    return N * NEW / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="rao_core/models/checkpoints/small-warmstart")
    args = ap.parse_args()
    tok = load_tokenizer(args.model)
    with tempfile.TemporaryDirectory() as tmp, engine_scope(Path(tmp)):
        engines = {
            "hf": HFEngine.from_pretrained(args.model, tok),
            "vllm": VLLMEngine.serving(VLLMPolicy(), Path(args.model), tok, 2048),
        }
        results = {}
        for seeded in (True, False):
            for conc in (1, 16, 64):
                for name, engine in engines.items():
                    results[name, conc, seeded] = asyncio.run(cell(engine, conc, seeded, len(tok)))
                print(
                    f"{'seeded' if seeded else 'unseeded':>8}, {conc:>2} in flight: "
                    f"hf {results['hf', conc, seeded]:6.0f} tokens/s, vllm {results['vllm', conc, seeded]:6.0f} "
                    f"tokens/s, vllm / hf = {results['vllm', conc, seeded] / results['hf', conc, seeded]:.1f}x",
                    flush=True,
                )


if __name__ == "__main__":
    interrupts.run_script(main)
