"""Benchmark: one decode step of the transformers engine, its work, its host reads and its host
time per rows in flight, the K/V bookkeeping of rows that arrive and leave, and (on a GPU) its
sampled tokens per second at 128 rows.

(a) ops: torch.profiler's count of operators dispatched by one decode step (HFEngine._step with
    every row decoding), at 1, 16 and 64 rows, on the fixed-shape path CUDA takes (`decode=static`,
    counted here on whatever device runs the bench) and on the CPU's runs path beside it;
(b) host syncs: the step's reads of device values (`.item()`, `int(t)`, `nonzero`: profiler
    operators that wait for the device) plus its explicit reads of the sampled tokens; on CUDA
    also counted by torch's own sync detector (`torch.cuda.set_sync_debug_mode`);
(c) host time per step: `--rows` requests (default 128) decoding together through the engine's
    event loop, as a rollout drives it; the wall time per decode step less the time inside the
    model's forwards and the sampling (what one CUDA graph replay does on a GPU): the Python
    bookkeeping, the staging copies, the read of the tokens and the event loop's round trips. On
    the CPU the forwards run inside their timer; on CUDA only their launches do, and the read of
    the tokens waits for the kernels, so there "host time" also holds the device's compute;
(d) K/V bookkeeping: kernels launched (operators that run one, views left out) to load an
    arriving row's reused K/V into its slot, and to copy a leaving row's K/V out and fill its slot;
(e) throughput (with --steps, the default on CUDA): decode steps of `--rows` rows after a prompt
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
from torch.utils._python_dispatch import TorchDispatchMode

from rao_core import interrupts
from rao_core.engines import kv_slots
from rao_core.engines.hf import HFEngine, _Seq
from rao_core.engines.hf_batch import Batch
from rao_core.engines.hf_static import request_key
from rao_core.engines.kv_slots import KVSlots
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


def request(prompt: list[int], seed: int, new: int = 10**6) -> GenerationRequest:
    return GenerationRequest(prompt, new, (), None, 1.0, seed=seed)  # type: ignore[arg-type]


def fill(engine: HFEngine, rows: int, prompt_len: int) -> Batch:
    """A batch of `rows` sampled rows (T = 1, seeded) with `prompt_len`-token prompts, prefilled,
    after one decode step (on CUDA the step's graph is captured there)."""
    loop, rng = asyncio.new_event_loop(), random.Random(0)
    seqs = []
    for i in range(rows):
        r = request([rng.randrange(3, 500) for _ in range(prompt_len)], i)
        seqs.append(_Seq(r, loop.create_future(), 10**6, key=request_key(i, engine.keys)))
    batch = engine.new_batch()
    engine._step(batch, seqs)
    engine._step(batch, [])
    loop.close()
    return batch


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


def host_ms_per_step(engine: HFEngine, rows: int, new: int = 64, prompt_len: int = 20) -> tuple[float, float]:
    """(host ms, model ms) per decode step: `rows` requests of `new` tokens each (eos off, so all
    decode together), through the engine's event loop; the second of two waves is timed."""
    rng, eos = random.Random(1), engine.eos_ids
    engine.eos_ids = set()

    async def wave(n: int) -> None:
        prompts = [[rng.randrange(3, 500) for _ in range(prompt_len)] for _ in range(rows)]
        await asyncio.gather(*[engine.generate(request(p, i, n)) for i, p in enumerate(prompts)])

    async def go() -> tuple[float, float]:
        try:
            await wave(4)
            st = engine.stats
            steps, forward, start = st.batches, st.forward_seconds, time.perf_counter()
            await wave(new)
            wall, steps = time.perf_counter() - start, st.batches - steps - 1  # one forward: the prefill
            forward = st.forward_seconds - forward
            return 1e3 * (wall - forward) / steps, 1e3 * forward / steps
        finally:
            await engine.close()
            engine.eos_ids = eos

    return asyncio.run(go())


class Launches(TorchDispatchMode):
    """Counts the operators dispatched that run a kernel (views are left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def bookkeeping_launches(engine: HFEngine, rows: int = 16, prompt_len: int = 40) -> tuple[float, float]:
    """(launches per arriving row, per leaving row) of K/V bookkeeping: `rows` rows finish (their
    K/V copied out to the prefix store, their slots filled by the last rows), then `rows` prompts
    extending them arrive (their K/V loaded back): the launches inside KVSlots' load, row_kv and
    move, over the rows that moved."""
    counted = {"load": 0, "row_kv": 0, "move": 0}
    originals = {name: getattr(KVSlots, name) for name in counted}

    def counting(name):
        def run(self, *a):
            with Launches() as c:
                out = originals[name](self, *a)
            counted[name] += c.count
            return out

        return run

    async def go() -> None:
        rng = random.Random(2)
        prompts = [[rng.randrange(3, 500) for _ in range(prompt_len)] for _ in range(2 * rows)]
        stay = [engine.generate(request(p, 100 + i, 40)) for i, p in enumerate(prompts[rows:])]
        first = await asyncio.gather(
            *[engine.generate(request(p, i, 4)) for i, p in enumerate(prompts[:rows])]
        )
        nexts = [p + g.token_ids + [7, 8, 9] for p, g in zip(prompts, first, strict=False)]
        await asyncio.gather(*[engine.generate(request(p, i, 4)) for i, p in enumerate(nexts)], *stay)
        await engine.close()

    for name in counted:
        setattr(KVSlots, name, counting(name))
    try:
        hits = engine.stats.prefix_hits
        asyncio.run(go())
        hits = engine.stats.prefix_hits - hits
    finally:
        for name, fn in originals.items():
            setattr(KVSlots, name, fn)
    return counted["load"] / max(hits, 1), (counted["row_kv"] + counted["move"]) / (2 * rows)


def tokens_per_s(engine: HFEngine, rows: int, prompt_len: int, steps: int) -> float:
    batch = fill(engine, rows, prompt_len)
    engine._step(batch, [])
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine._step(batch, [])
    return rows * steps / (time.perf_counter() - start)  # each step ends in a read of its tokens


def done(engine: HFEngine):
    """Close an engine and give its slots back (on CUDA each engine sizes its own from what is free)."""
    asyncio.run(engine.close())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", choices=["tiny", "0.6b", "4b"], default="tiny")
    ap.add_argument(
        "--rows", type=int, default=128, help="rows in flight for the host time (c) and throughput (e)"
    )
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens per row for (e)")
    ap.add_argument(
        "--steps", type=int, default=None, help="decode steps timed in (e) (default: 64 on CUDA, 0 on CPU)"
    )
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = build(a.shape, a.device)
    cuda = a.device == "cuda"

    def engine(path: str, **kw) -> HFEngine:
        return HFEngine(model, tok, max_batch_size=max(64, a.rows), decode=path, **kw)

    print(
        f"model: {a.shape} shape on {a.device}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters"
    )
    for path in ("static", "runs"):
        eng = engine(path)
        counted = {r: ops_of_one_step(eng, r) for r in (1, 16, 64)}
        ops = ", ".join(f"rows {r} = {c[0]}" for r, c in counted.items())
        syncs = max(c[1] + c[2] for c in counted.values())
        print(f"[{path}] ops per decode step: {ops}")
        print(f"[{path}] host syncs per decode step: {syncs} (device waits {max(c[1] for c in counted.values())}, "
              f"token reads {max(c[2] for c in counted.values())})")  # fmt: skip
        if cuda:
            print(
                f"[{path}] CUDA syncs detected by torch in one step of 64 rows: {cuda_syncs_of_one_step(eng, 64)}"
            )
        done(eng)
    host, forward = host_ms_per_step(engine("static"), a.rows)  # closes its engine
    print(f"[static] host time per decode step at {a.rows} rows: {host:.2f} ms (the model's forward and "
          f"sampling beside it: {forward:.2f} ms)")  # fmt: skip
    arriving, leaving = bookkeeping_launches(engine("static"))  # closes its engine
    print(f"[static] K/V bookkeeping launches: {arriving:.1f} per arriving row (its reused K/V loaded), "
          f"{leaving:.1f} per leaving row (copied out, its slot filled)")  # fmt: skip
    steps = a.steps if a.steps is not None else (64 if cuda else 0)
    if not steps:
        return
    rates, captures = {}, ""
    variants = {"static": ("static", {}), "runs": ("runs", {})}  # the runs path is the slow one on a GPU
    if cuda:  # the same static steps eagerly, with torch's choice of attention (cuDNN's allowed) and without
        variants |= {"static, eager, any attention": ("static", {"cuda_graphs": False}),
                     "static, eager": ("static", {"cuda_graphs": False})}  # fmt: skip
    for name, (path, kw) in variants.items():
        keep = kv_slots.CUDA_ATTENTION
        kv_slots.CUDA_ATTENTION = None if name.endswith("any attention") else keep
        eng = engine(path, **kw)
        try:
            rates[name] = tokens_per_s(
                eng, a.rows, a.prompt, steps if path == "static" else max(1, steps // 8)
            )
        finally:
            kv_slots.CUDA_ATTENTION = keep
        if name == "static":
            captures = (
                f"graph captures {eng.stats.graph_captures}, fallbacks to eager {eng.stats.graph_fallbacks}"
            )
        done(eng)
    print(f"decode at {a.rows} rows after {a.prompt}-token prompts, {steps} steps: "
          + ", ".join(f"{p} {r:,.0f} tokens/s" for p, r in rates.items())
          + f"; static / runs = {rates['static'] / rates['runs']:.1f}x")  # fmt: skip
    print(f"[static] {captures}")


if __name__ == "__main__":
    interrupts.run_script(main)
