"""One round at Qwen3-0.6B's shapes through the transformers engine, on CUDA (or a tiny shape on a CPU).

scripts/real_size_round.py runs `rao train` with vLLM; this drives the same stages through
rao_core's own functions (warm start, rollout, score, train: no Prefect, no MLflow, no vLLM) on a
model with random weights, served in bf16 on CUDA and trained with float32 master weights. It
records the rollout (trees, nodes, sampled tokens, seconds, sampled tokens/s with tasks x group
trees in flight, peak GPU memory) and its engine's own figures (decode and prefill seconds apart,
decode steps and their mean rows, CUDA graph captures and fallbacks to eager steps, its K/V
slots), the train step (seconds, tokens, peak memory) and the memory plan of rao_core/memory.py
for the same settings (what `rao train --check` prints) beside them, into OUT/real_size_SHAPE.json
after each phase (a run stopped by a timeout keeps what it measured).

    python scripts/real_size_cuda.py --out DIR [--shape 0.6b|tiny] [--device cuda] [--tasks 32 --group 4]
        [--rows 128] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.real_size_round import QWEN3_0_6B  # noqa: E402

# --shape tiny: the same code path at a size a CPU runs in seconds (the dry run of scripts/gpu_check.sh)
TINY = {**QWEN3_0_6B, "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
SHAPES = {"0.6b": QWEN3_0_6B, "tiny": TINY}


def gib(b: float) -> float:
    return round(b / 2**30, 2)


def build(folder: Path, shape: dict, device: str) -> Path:
    """scripts/real_size_round.py's build(), initialised on `device`: random weights saved in bf16, the
    tokenizer's 512 rows scaled up and the others zeroed, so the model samples tokens it can read."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rao_core.models.tokenizer import tiny_tokenizer

    if (folder / "config.json").is_file():
        return folder
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(
            Qwen3Config(**shape, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        )
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[len(tok) :].zero_()
        emb[: len(tok)] *= 20
    model.generation_config.eos_token_id = tok.eos_token_id
    model.to(torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def opened_engines() -> list:
    """Every HFEngine built from now on, in order (the rollout's is the first)."""
    from rao_core.engines.hf import HFEngine

    seen, init = [], HFEngine.__init__

    def recording(self, *args, **kw):
        init(self, *args, **kw)
        seen.append(self)

    HFEngine.__init__ = recording
    return seen


def engine_figures(engine) -> dict:
    """The engine's own account of the round: decode and prefill apart, graphs, slots."""
    st = engine.stats
    return {
        "decode_seconds": round(st.decode_seconds, 2), "prefill_seconds": round(st.prefill_seconds, 2),
        "forward_seconds": round(st.forward_seconds, 2), "tokens_generated": st.tokens_generated,
        "tokens_per_decode_second": round(st.tokens_generated / max(st.decode_seconds, 1e-9), 1),
        "forwards": st.batches, "mean_rows": round(sum(st.batch_sizes) / max(len(st.batch_sizes), 1), 1),
        "max_rows": max(st.batch_sizes, default=0), "prefill_tokens": st.prefill_tokens,
        "prompt_tokens": st.prompt_tokens, "prefix_hits": st.prefix_hits, "wakes": st.wakes,
        "graph_captures": st.graph_captures, "graph_fallbacks": st.graph_fallbacks,
        "graphs_on": bool(engine.static and engine.static.graphs_on), "slots": engine.slot_shape,
        "decode": "static" if engine.static is not None else "runs",
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.6b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tasks", type=int, default=32, help="root tasks of the round")
    ap.add_argument("--group", type=int, default=4, help="trees per task: tasks x group trees in flight")
    ap.add_argument(
        "--rows", type=int, default=128, help="policy.max_batch_size: rows the engine decodes at once"
    )
    ap.add_argument(
        "--new-tokens", type=int, default=256, help="agent.max_new_tokens: a turn's tokens at most"
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more settings")
    a = ap.parse_args()
    import torch

    from rao_core import campaign, memory, runlock
    from rao_core.eval.metrics import load_round, summarize
    from rao_core.run import Run, load_config
    from rao_core.stages.rollout import roll_out
    from rao_core.stages.score import score
    from rao_core.stages.synthesize import synthesize
    from rao_core.stages.train import train
    from rao_core.stages.warm_start import warm_start
    from rao_core.store.parquet import read_meta

    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cuda = a.device == "cuda"
    dest = out / f"real_size_{a.shape}.json"
    result: dict = {"shape": a.shape, "device": a.device}

    def save() -> None:  # after each phase: a run stopped by its timeout keeps what it measured
        dest.write_text(json.dumps(result, indent=2, default=str))

    t0 = time.perf_counter()
    folder = build(out / f"qwen3-{a.shape}-shaped", SHAPES[a.shape], a.device)
    result["build_seconds"] = round(time.perf_counter() - t0, 1)
    trees = a.tasks * a.group
    result["overrides"] = [
        f"runs_dir={out}", f"run_name=round-{a.shape}", f"policy.model={folder}", "policy.kind=hf",
        "policy.engine_processes=0", f"policy.device={a.device}", f"train.device={a.device}",
        f"policy.dtype={'bfloat16' if cuda else 'float32'}",
        "campaign.rounds=1", f"rollout.num_tasks={a.tasks}", f"rollout.group_size={a.group}",
        f"rollout.max_concurrent_trees={trees}", f"policy.max_batch_size={a.rows}", "agent.max_steps=3",
        f"agent.max_new_tokens={a.new_tokens}",
        "eval.num_tasks=2", "eval.trees_to_render=0", "scoring.zero_advantage_groups=keep",
        "train.gradient_checkpointing=true", "train.max_tokens_per_microbatch=2048",
        "train.steps_per_round=1", "train.lr=3e-6", "tracking.enabled=false", *a.set,
    ]  # fmt: skip
    cfg = load_config(None, result["overrides"])
    found = memory.devices()
    plan = memory.plan(cfg.train, cfg.policy, folder, found)
    print(memory.table(plan, found), flush=True)
    result["memory_plan_gib"] = {s: round(plan.total(s), 2) for s in plan.stages}
    save()
    run = Run(cfg)
    engines = opened_engines()
    with runlock.writing(cfg.run_dir, "scripts/real_size_cuda.py"), campaign.engines(run):
        synthesize(run)
        warm_start(run)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        roll_out(run, 0)
        table = load_round(cfg.layout, 0)
        s, seconds = summarize(table), read_meta(cfg.layout.rollouts(0)).get("seconds", 0.0)
        sampled = sum(table.column("action_tokens").to_pylist())
        result["rollout"] = {
            "trees": s["trees"], "trees_in_flight": min(trees, cfg.rollout.max_concurrent_trees),
            "nodes": s["nodes"], "node_turns": s["node_turns"], "statuses": s["statuses"],
            "sampled_tokens": sampled, "seconds": round(seconds, 2),
            "sampled_tokens_per_s": round(sampled / max(seconds, 1e-9), 1),
            "peak_gpu_gib": gib(torch.cuda.max_memory_allocated()) if cuda else None,
        }  # fmt: skip
        result["rollout"]["engine"] = engine_figures(engines[0]) if engines else None
        print(json.dumps(result["rollout"]), flush=True)
        save()
        score(run, 0)
        if cuda:
            torch.cuda.empty_cache()
        t = time.perf_counter()
        m = train(run, 0)  # checkpoint v1: bf16 copy, float32 master, AdamW moments
        keep = ("seconds", "tokens", "action_tokens", "steps", "device", "bf16", "peak_gpu_mib", "peak_rss_mib",
                "gpu_free_gib_at_start", "gpu_total_gib", "loss", "served_changed", "served_dtype")  # fmt: skip
        result["train"] = {k: m[k] for k in keep if k in m}
        result["train"]["stage_wall_seconds"] = round(time.perf_counter() - t, 2)
        print(json.dumps(result["train"]), flush=True)
    peak = m.get("peak_gpu_mib") if cuda else m.get("peak_rss_mib")
    result["plan_vs_measured_gib"] = {
        "train": {"plan": result["memory_plan_gib"].get("train"), "measured_peak": round(peak / 1024, 2) if peak else None},
        "rollout": {"plan": result["memory_plan_gib"].get("rollout"), "measured_peak": result["rollout"]["peak_gpu_gib"]},
    }  # fmt: skip
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    save()
    print(json.dumps(result["plan_vs_measured_gib"]), f"-> {dest}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
