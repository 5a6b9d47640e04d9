"""Benchmark: training tokens/s of the RAO stage (TRL GRPOTrainer subclass) vs plain TRL SFTTrainer.

    .venv/bin/python bench/train_bench.py [--preset cpu|qwen3-0.6b|qwen3-4b] [--rows 32] [--length 512]

Both sides train the same randomly initialised Qwen3 (same seed) on the same token sequences, loss on
the same action tokens, the same micro-batches (equal-length rows, `budget // length` rows each) and
one optimiser step per pass with gradient accumulation over all micro-batches. SFT is TRL's own
cross-entropy trainer with its defaults otherwise, the cheapest TRL loop there is: the overhead of
the RAO stage is (SFT tokens/s) / (RAO tokens/s) - 1. Each side runs in its own subprocess, does one
untimed warm-up pass, then `--repeats` timed passes of `trainer.train()` (trainer construction and
dataset preparation excluded on both sides); the best pass is reported. Peak memory: on CUDA the
allocator's peak during the timed passes; on CPU the peak RSS sampled every 5 ms during them, and
its growth over the RSS before them (gradients, AdamW state, activations).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

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


def build_rows(n: int, length: int, vocab: int, seed: int = 0):
    """Node-like rows: a 64-token prompt, then 48-token actions and 32-token observations."""
    import numpy as np

    from rao_core.train.samples import make_row

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        ids = rng.integers(3, vocab, length)
        mask = np.zeros(length, dtype=np.int8)
        for start in range(64, length, 80):
            mask[start : start + 48] = 1
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
        gradient_checkpointing=args.gradient_checkpointing,
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--budget", type=int, default=4096, help="max_tokens_per_microbatch")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--threads", type=int, default=1, help="CPU torch threads (1 is steadier on a busy machine)"
    )
    p.add_argument("--side", choices=["rao", "sft"], help=argparse.SUPPRESS)
    args = p.parse_args()
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
    main()
