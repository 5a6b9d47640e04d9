"""Benchmark: one decode step of the transformers engine, its work and its host reads per rows in
flight, and (on a GPU) its sampled tokens per second at 128 rows.

(a) ops: torch.profiler's count of operators dispatched by one decode step (HFEngine._step with
    every row decoding), at 1, 16 and 64 rows, on the fixed-shape path CUDA takes (`decode=static`,
    counted here on whatever device runs the bench) and on the CPU's runs path beside it;
(b) host syncs: the step's reads of device values (`.item()`, `int(t)`, `nonzero`: profiler
    operators that wait for the device) plus its explicit reads of the sampled tokens; on CUDA
    also counted by torch's own sync detector (`torch.cuda.set_sync_debug_mode`);
(c) throughput (with --steps, the default on CUDA): decode steps of `--rows` rows after a prompt
    of `--prompt` tokens, both paths, sampled tokens per second and their ratio.

The model is built here from a config with random weights (no download): `tiny` (the project's
0.85M-parameter shape), `0.6b` or `4b` (Qwen3's shapes, bf16 on CUDA).

    .venv/bin/python bench/decode_bench.py [--device cuda] [--shape 0.6b] [--rows 128] [--steps 64]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import warnings

import torch

from rao_core.engines import hf_batch
from rao_core.engines.hf import HFEngine, _Seq
from rao_core.engines.hf_batch import Batch
from rao_core.models.tiny import build_tiny_model
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.policy import GenerationRequest

SHAPES = {  # Qwen3's published shapes (random weights here)
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32),
}
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2")


def build(shape: str, device: str):
    """(model, tokenizer): the tiny shape, or a Qwen3 shape with the 151,936-token vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = tiny_tokenizer()
    if shape == "tiny":
        return build_tiny_model(tok).to(device), tok
    config = Qwen3Config(
        vocab_size=151936, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **SHAPES[shape],
    )  # fmt: skip
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    return model.eval(), tok


def fill(engine: HFEngine, rows: int, prompt_len: int) -> Batch:
    """A batch of `rows` sampled rows (T = 1, seeded) with `prompt_len`-token prompts, prefilled,
    after one decode step (on CUDA the step's graph is captured there)."""
    loop, rng = asyncio.new_event_loop(), random.Random(0)
    seqs = []
    for i in range(rows):
        prompt = [rng.randrange(3, 500) for _ in range(prompt_len)]
        request = GenerationRequest(prompt, 10**6, (), None, 1.0, seed=i)  # type: ignore[arg-type]
        seqs.append(_Seq(request, loop.create_future(), 10**6, key=engine_key(engine, i)))
    batch = Batch(engine.device)
    engine._step(batch, seqs)
    engine._step(batch, [])
    loop.close()
    return batch


def engine_key(engine: HFEngine, seed: int) -> int:
    from rao_core.engines.hf_static import request_key

    return request_key(seed, engine.keys)


def ops_of_one_step(engine: HFEngine, rows: int, prompt_len: int = 20) -> tuple[int, int, int]:
    """(operators, operators that wait for the device, explicit host reads) of one decode step."""
    batch = fill(engine, rows, prompt_len)
    reads = engine.stats.host_reads
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        engine._step(batch, [])
    names = [e.name for e in prof.events() if e.name.startswith("aten::")]
    return len(names), sum(n in SYNC_OPS for n in names), engine.stats.host_reads - reads


def cuda_syncs_of_one_step(engine: HFEngine, rows: int, prompt_len: int = 20) -> int:
    """Synchronizations torch itself detects in one decode step (CUDA only)."""
    batch = fill(engine, rows, prompt_len)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine._step(batch, [])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def tokens_per_s(engine: HFEngine, rows: int, prompt_len: int, steps: int) -> float:
    batch = fill(engine, rows, prompt_len)
    engine._step(batch, [])
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine._step(batch, [])
    return rows * steps / (time.perf_counter() - start)  # each step ends in a read of its tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", choices=["tiny", "0.6b", "4b"], default="tiny")
    ap.add_argument("--rows", type=int, default=128, help="rows in flight for the throughput (c)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens per row for (c)")
    ap.add_argument(
        "--steps", type=int, default=None, help="decode steps timed in (c) (default: 64 on CUDA, 0 on CPU)"
    )
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = build(a.shape, a.device)
    engines = {
        path: HFEngine(model, tok, max_batch_size=max(64, a.rows), decode=path) for path in ("static", "runs")
    }
    print(
        f"model: {a.shape} shape on {a.device}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters"
    )
    for path, engine in engines.items():
        counted = {rows: ops_of_one_step(engine, rows) for rows in (1, 16, 64)}
        ops = ", ".join(f"rows {r} = {c[0]}" for r, c in counted.items())
        syncs = max(c[1] + c[2] for c in counted.values())
        print(f"[{path}] ops per decode step: {ops}")
        print(f"[{path}] host syncs per decode step: {syncs} (device waits {max(c[1] for c in counted.values())}, "
              f"token reads {max(c[2] for c in counted.values())})")  # fmt: skip
        if a.device == "cuda":
            print(
                f"[{path}] CUDA syncs detected by torch in one step of 64 rows: {cuda_syncs_of_one_step(engine, 64)}"
            )
    steps = a.steps if a.steps is not None else (64 if a.device == "cuda" else 0)
    if steps:  # the runs path is the slow one on a GPU: fewer steps
        rates = {"static": tokens_per_s(engines["static"], a.rows, a.prompt, steps),
                 "runs": tokens_per_s(engines["runs"], a.rows, a.prompt, max(1, steps // 8))}  # fmt: skip
        if a.device == "cuda":  # the same static steps with torch's choice of attention (cuDNN's allowed)
            hf_batch.CUDA_ATTENTION, keep = None, hf_batch.CUDA_ATTENTION
            eager = HFEngine(model, tok, max_batch_size=max(64, a.rows), decode="static", cuda_graphs=False)
            rates["static, eager, any attention"] = tokens_per_s(eager, a.rows, a.prompt, steps)
            hf_batch.CUDA_ATTENTION = keep
            eager = HFEngine(model, tok, max_batch_size=max(64, a.rows), decode="static", cuda_graphs=False)
            rates["static, eager"] = tokens_per_s(eager, a.rows, a.prompt, steps)
        print(f"decode at {a.rows} rows after {a.prompt}-token prompts, {steps} steps: "
              + ", ".join(f"{p} {r:,.0f} tokens/s" for p, r in rates.items())
              + f"; static / runs = {rates['static'] / rates['runs']:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
