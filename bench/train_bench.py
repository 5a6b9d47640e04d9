"""Benchmark: training tokens/s of the RAO stage (TRL GRPOTrainer subclass) vs plain TRL SFTTrainer,
and (--throughput) the stage's tokens/s, TFLOP/s, MFU and peak memory against the plan, per setting.

    .venv/bin/python bench/train_bench.py [--preset cpu|qwen3-0.6b|qwen3-4b] [--rows 32] [--length 512]
    .venv/bin/python bench/train_bench.py --throughput [--preset qwen3-4b] [--variant NAME:key=value,...]
    .venv/bin/python bench/train_bench.py --adamw-step

Both sides train the same randomly initialised Qwen3 (same seed) on the same token sequences, loss on
the same action tokens, the same micro-batches (equal-length rows, `budget // length` rows each) and
one optimiser step per pass with gradient accumulation over all micro-batches. SFT is TRL's own
cross-entropy trainer with its defaults otherwise, the cheapest TRL loop there is: the overhead of
the RAO stage is (SFT tokens/s) / (RAO tokens/s) - 1. Each side runs in its own subprocess, does one
untimed warm-up pass, then `--repeats` timed passes of `trainer.train()` (trainer construction and
dataset preparation excluded on both sides); the best pass is reported. Peak memory: on CUDA the
allocator's peak during the timed passes; on CPU the peak RSS sampled every 5 ms during them, and
its growth over the RSS before them (gradients, AdamW state, activations).

--throughput runs the RAO stage alone, in this process, once per variant (TrainConfig settings;
the first is the baseline the others are compared with): one untimed micro-batch, then `--repeats`
timed rounds of `train_rows`, the fastest reported with the metrics a round writes (tokens/s,
model TFLOP/s, MFU on a GPU of rao_core/train/flops.py's table) and, on CUDA, the allocator's peak
against rao_core/memory.py's training estimate for the same settings. A round's seconds include
TRL's fixed costs (trainer set-up, accelerate's ~0.5 s gc): more rows per round amortise them.
Default variants on CUDA: the H200 run's settings (2,048-token micro-batches, foreach AdamW,
gradient checkpointing), then 16,384-token micro-batches with fused AdamW, then 8,192-token
micro-batches without checkpointing; on a CPU, 512- against 2,048-token micro-batches.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rao_core import interrupts  # noqa: E402

PRESETS = {  # hidden, layers, heads, kv heads, head_dim, intermediate, vocab
    "cpu": (256, 4, 4, 2, 64, 768, 8192),
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151936),
    "qwen3-4b": (2560, 36, 32, 8, 128, 9728, 151936),
}


def build_model(preset: str, seed: int = 0):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden, layers, heads, kv, head_dim, inter, vocab = PRESETS[preset]
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, intermediate_size=inter, max_position_embeddings=32768,
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg)


def build_rows(n: int, length: int, vocab: int, seed: int = 0, shape: tuple[int, int, int] = (64, 48, 32)):
    """Node-like rows: a prompt, then actions and observations in turn (`shape`: their token counts;
    the default 64, 48, 32; `--shape small` is a textcraft-small node's 160, 13, 15, 21% actions)."""
    import numpy as np

    from rao_core.train.samples import make_row

    prompt, action, observation = shape
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        ids = rng.integers(3, vocab, length)
        mask = np.zeros(length, dtype=np.int8)
        for start in range(prompt, length, action + observation):
            mask[start : start + action] = 1
        logprobs = np.where(mask == 1, -rng.uniform(0.1, 4.0, length), 0.0).astype(np.float32)
        rows.append(make_row(f"n{i:04d}", ids, mask, logprobs, float(rng.choice([-1.0, 0.5, 1.0]))))
    return rows


class PeakRSS:
    """Samples this process's resident memory in a thread (CPU peak memory of a code region)."""

    def __init__(self) -> None:
        self.peak = self.start = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.rss())

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def rao_pass(model, tok, rows, args, device):
    from rao_core.train.trainer import TrainConfig, train_rows

    cfg = TrainConfig(
        lr=1e-5, max_tokens_per_microbatch=args.budget, device=device, steps_per_round=1,
        gradient_checkpointing=args.gradient_checkpointing, fused_adamw=False,  # SFT's AdamW
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        model, metrics = train_rows(model, tok, rows, cfg, Path(work))
    return model, metrics["seconds"], metrics["microbatches"]


def sft_pass(model, tok, rows, args, device):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    per_mb = max(1, args.budget // args.length)
    data = Dataset.from_dict(
        {
            "input_ids": [r.token_ids.tolist() for r in rows],
            "completion_mask": [r.action_mask.astype(int).tolist() for r in rows],
        }
    )
    with tempfile.TemporaryDirectory() as work:
        cfg = SFTConfig(
            output_dir=work, per_device_train_batch_size=per_mb, gradient_accumulation_steps=-(-len(rows) // per_mb),
            num_train_epochs=1, learning_rate=1e-5, max_length=None, completion_only_loss=True,
            bf16=device == "cuda", use_cpu=device == "cpu", gradient_checkpointing=args.gradient_checkpointing,
            report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, lr_scheduler_type="constant",
            optim="adamw_torch", adam_beta2=0.95, weight_decay=0.017,
        )  # fmt: skip
        trainer = SFTTrainer(model=model, args=cfg, train_dataset=data, processing_class=tok)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
    return trainer.model, seconds, -(-len(rows) // per_mb)


def side(args) -> dict:
    import torch

    from rao_core.models.tokenizer import tiny_tokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(args.threads)
    tok = tiny_tokenizer()
    model = build_model(args.preset).to(device)
    rows = build_rows(args.rows, args.length, PRESETS[args.preset][6])
    fn = rao_pass if args.side == "rao" else sft_pass
    per_mb = max(1, args.budget // args.length)
    model, _, _ = fn(model, tok, rows[:per_mb], args, device)  # warm-up: one micro-batch
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    with PeakRSS() as mem:
        for _ in range(args.repeats):
            model, seconds, n_mb = fn(model, tok, rows, args, device)
            times.append(seconds)
    tokens = sum(r.length for r in rows)
    out = {
        "side": args.side,
        "device": device,
        "tokens": tokens,
        "microbatches": n_mb,
        "seconds": times,
        "tokens_per_s": tokens / min(times),
        "peak_rss_mib": mem.peak / 2**20,
        "rss_growth_mib": (mem.peak - mem.start) / 2**20,
    }
    if device == "cuda":
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


SHAPES = {"default": (64, 48, 32), "small": (160, 13, 15)}  # prompt, action, observation tokens

VARIANTS = {
    "cuda": [
        "h200-run:max_tokens_per_microbatch=2048,fused_adamw=false,gradient_checkpointing=true",
        "levers:max_tokens_per_microbatch=16384,gradient_checkpointing=true",
        "no-recompute:max_tokens_per_microbatch=8192,gradient_checkpointing=false",
    ],
    "cpu": ["budget-512:max_tokens_per_microbatch=512", "budget-2048:max_tokens_per_microbatch=2048"],
}


def variant(spec: str, device: str):
    """'name:key=value,...' -> (name, TrainConfig); values are JSON (true, null, 2048) or strings."""
    from rao_core.train.trainer import TrainConfig

    name, _, settings = spec.partition(":")
    over = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        try:
            over[key] = json.loads(value)
        except json.JSONDecodeError:
            over[key] = value
    base = dict(lr=1e-5, device=device, steps_per_round=1, keep_optimizer_state=False)
    return name, TrainConfig(**{**base, **over})


def plan_gib(model, cfg) -> float:
    """rao_core/memory.py's training estimate (`rao train --check`) for this model and settings.

    The plan reads a model folder's config.json and safetensors headers only, so a header without
    the weights stands in for the model (a 4B checkpoint would take a minute to write)."""
    from rao_core import memory
    from rao_core.run import load_config

    with tempfile.TemporaryDirectory() as folder:
        model.config.to_json_file(Path(folder) / "config.json")
        header, offset = {}, 0
        for name, p in model.named_parameters():  # a tied weight once, as save_pretrained writes it
            header[name] = {
                "dtype": "BF16",
                "shape": list(p.shape),
                "data_offsets": [offset, offset + 2 * p.numel()],
            }
            offset += 2 * p.numel()
        blob = json.dumps(header).encode()
        (Path(folder) / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
        policy = load_config(overrides=[f"policy.model={folder}"]).policy
        return memory.plan(cfg, policy, Path(folder), memory.devices()).total("train")


def matmul_gflops(dtype, threads: int) -> float:
    """This machine's rate for one 4096 x 576 x 1536 matmul (a 135M model's MLP shape) in `dtype`:
    the ceiling the training step's TFLOP/s is read against."""
    import torch

    a, b = torch.randn(4096, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    for _ in range(3):
        a @ b
    n, t0 = 20, time.perf_counter()
    for _ in range(n):
        a @ b
    return 2 * 4096 * 576 * 1536 * n / (time.perf_counter() - t0) / 1e9


def throughput(args) -> None:
    """Every variant in this process, on the same model and rows; ratios against the first."""
    import torch

    from rao_core.models.tokenizer import tiny_tokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model:  # a real checkpoint (a shipped name, smollm2-135m, a folder, a hub id), in float32
        from transformers import AutoTokenizer

        from rao_core.models.loading import load_causal_lm
        from rao_core.models.locate import local_model

        folder = local_model(args.model)
        model = load_causal_lm(folder, dtype=torch.float32).to(device)
        tok, what = AutoTokenizer.from_pretrained(folder, local_files_only=True), args.model
    else:
        with torch.device(device):  # a 4B init on the GPU takes seconds, on a CPU minutes
            model = build_model(args.preset)
        tok, what = tiny_tokenizer(), f"preset {args.preset} {PRESETS[args.preset]}"
    shape = SHAPES[args.shape]
    rows = build_rows(args.rows, args.length, model.config.vocab_size, shape=shape)
    actions = sum(r.action_tokens for r in rows) / sum(r.length for r in rows)
    print(
        f"throughput: {what}, {args.rows} rows x {args.length} tokens ({args.shape}: {actions:.0%} action tokens), "
        f"{torch.cuda.get_device_name() if device == 'cuda' else f'CPU, {args.threads} threads'}"
    )
    if device == "cpu":
        fp32, bf16 = matmul_gflops(torch.float32, args.threads), matmul_gflops(torch.bfloat16, args.threads)
        print(f"this CPU's 4096x576x1536 matmul: {fp32:,.0f} GFLOP/s fp32, {bf16:,.0f} GFLOP/s bf16")
    base = None
    for spec in args.variant or VARIANTS[device]:
        name, cfg = variant(spec, device)
        try:
            best, peak = timed_rounds(model, tok, rows, cfg, args)
        except torch.OutOfMemoryError:  # what stops a lever is a result too
            model.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            print(f"{name:13s} out of memory (plan {plan_gib(model, cfg):.1f} GiB)", flush=True)
            continue
        base = base or {**best, "peak": peak}
        line = (
            f"{name:13s} {best['tokens']:,} tokens ({best['padded_tokens']:,} padded) in {best['microbatches']} "
            f"micro-batches: {best['tokens_per_s']:,.0f} tokens/s (x{best['tokens_per_s'] / base['tokens_per_s']:.2f}), "
            f"{best['tflops']:.3g} TFLOP/s" + (f", MFU {best['mfu']:.1%}" if "mfu" in best else "")
        )
        if device == "cuda":
            plan = plan_gib(model, cfg)
            line += f"; peak {peak:.1f} GiB (x{peak / base['peak']:.2f}), plan {plan:.1f} GiB ({plan / peak - 1:+.0%})"
        print(line, flush=True)


def timed_rounds(model, tok, rows, cfg, args) -> tuple[dict, float]:
    """One untimed micro-batch, then `args.repeats` rounds of `train_rows` (training `model` in
    place): the fastest round's metrics and the highest allocator peak (GiB; 0 on a CPU)."""
    import torch

    from rao_core.train.trainer import train_rows

    per_mb = max(1, cfg.max_tokens_per_microbatch // args.length)
    with tempfile.TemporaryDirectory() as work:
        train_rows(model, tok, rows[:per_mb], cfg, Path(work))  # one process: the same model back
    best, peak = None, 0.0
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as work:
            _, m = train_rows(model, tok, rows, cfg, Path(work))
        model.zero_grad(set_to_none=True)
        gc.collect()  # the round's trainer and AdamW state, before the next round's peak
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        peak = max(peak, m.get("peak_gpu_mib", 0.0) / 1024)
        best = m if best is None or m["tokens_per_s"] > best["tokens_per_s"] else best
    return best, peak


def adamw_step_bytes(mode: str, device: str) -> float:
    """Bytes per parameter that one AdamW step allocates beyond its weights, gradients and moments
    (`mode`: foreach, the plain AdamW's path on CUDA, or fused): 12 float32 matrices of 4096 x 4096
    (201M parameters), after a first step has allocated the moments. Peak allocated memory on CUDA,
    peak RSS on a CPU (where torch would otherwise take the per-tensor path: foreach is forced)."""
    import torch

    params = [torch.nn.Parameter(torch.randn(4096, 4096, device=device)) for _ in range(12)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(
        params, lr=1e-3, weight_decay=0.017, foreach=mode == "foreach", fused=mode == "fused"
    )
    opt.step()
    n = sum(p.numel() for p in params)
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / n
    with PeakRSS() as mem:
        time.sleep(0.05)
        opt.step()
        time.sleep(0.05)
    return (mem.peak - mem.start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    p.add_argument("--rows", type=int, help="16 (--throughput: 8 on a CPU, 16 on CUDA)")
    p.add_argument("--length", type=int, help="512 (--throughput: 256 on a CPU, 1024 on CUDA)")
    p.add_argument("--budget", type=int, default=4096, help="max_tokens_per_microbatch")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--threads", type=int, default=1, help="CPU torch threads (1 is steadier on a busy machine)"
    )
    p.add_argument("--throughput", action="store_true", help="tokens/s, TFLOP/s, MFU, memory per variant")
    p.add_argument("--model", help="--throughput: a real checkpoint instead of a preset (e.g. smollm2-135m)")
    p.add_argument(
        "--shape", default="default", choices=sorted(SHAPES), help="rows' prompt/action/observation lengths"
    )
    p.add_argument(
        "--variant", action="append", help="--throughput: NAME:key=value,... (TrainConfig; repeatable)"
    )
    p.add_argument(
        "--adamw-step", action="store_true", help="bytes/param an AdamW step allocates, foreach vs fused"
    )
    p.add_argument("--side", choices=["rao", "sft", "foreach", "fused"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side in ("foreach", "fused"):
        import torch

        print(adamw_step_bytes(args.side, "cuda" if torch.cuda.is_available() else "cpu"))
        return
    if args.adamw_step:  # each in its own process: a process's peak RSS only grows
        for mode in ("foreach", "fused"):
            out = subprocess.run(
                [sys.executable, __file__, "--side", mode], capture_output=True, text=True, cwd=ROOT
            )
            if out.returncode:
                sys.exit(f"{mode} failed:\n{out.stderr[-4000:]}")
            value = float(out.stdout.strip().splitlines()[-1])
            print(f"AdamW step, {mode}: {value:.2f} B/param beyond weights, gradients and moments")
        return
    if args.throughput:
        import torch

        cuda = torch.cuda.is_available()
        args.rows, args.length = args.rows or (16 if cuda else 8), args.length or (1024 if cuda else 256)
        throughput(args)
        return
    args.rows, args.length = args.rows or 16, args.length or 512
    if args.side:
        print(json.dumps(side(args)))
        return
    import torch

    print(
        f"preset {args.preset} {PRESETS[args.preset]}, {args.rows} rows x {args.length} tokens, "
        f"budget {args.budget} tokens/micro-batch, {os.cpu_count()} CPUs, "
        f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else f'CPU threads {args.threads}'}"
    )
    results = {}
    for name in ("sft", "rao"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--side", name]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode:
            sys.exit(f"{name} side failed:\n{proc.stderr[-4000:]}")
        results[name] = r = json.loads(proc.stdout.strip().splitlines()[-1])
        mem = f"peak GPU {r['peak_gpu_mib']:,.0f} MiB" if "peak_gpu_mib" in r else ""
        print(
            f"{name.upper():4s} {r['tokens']:,} tokens in {r['microbatches']} micro-batches: "
            f"{r['tokens_per_s']:,.0f} tokens/s (passes {', '.join(f'{s:.2f}' for s in r['seconds'])} s)  "
            f"peak RSS {r['peak_rss_mib']:,.0f} MiB (+{r['rss_growth_mib']:,.0f} in training) {mem}"
        )
    overhead = results["sft"]["tokens_per_s"] / results["rao"]["tokens_per_s"] - 1
    print(f"RAO overhead vs SFT: {100 * overhead:+.1f}% (goal <= +15%)")


if __name__ == "__main__":
    interrupts.run_script(main)
