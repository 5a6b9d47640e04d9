#!/usr/bin/env bash
# The GPU path end to end, on the tiny model, in under 10 minutes: install both environments (the
# project's, vLLM's CUDA build), then two 2-round campaigns with vLLM on the GPU:
#   1. a bf16 checkpoint at the paper's lr 3e-6, vLLM serving bf16 and sleeping while the trainer
#      runs (issue 22 goals 1 and 5): the trainer's float32 master weights carry across rounds, so
#      the share of served weights changed since v0 grows; the server sleeps, wakes, reloads and
#      passes the probe check, and never restarts; the trainer starts with vLLM's share free;
#   2. LoRA (goal 2): vLLM serves the base and hot-loads each round's adapter; the sampler's
#      log-probs are the trainer's; the adapter and its moments carry on; peak GPU memory vs (1).
# Run it whenever a GPU is available:  bash scripts/gpu_check.sh     (docs/scale-out.md)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PREFECT_HOME="$PWD/.prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
OUT=${OUT:-runs/gpu-check}
make install
make vllm VLLM_REQS=requirements/vllm-gpu.txt
.venv/bin/rao doctor --set policy.kind=vllm --set policy.device=cuda --set train.device=cuda
rm -rf "$OUT" && mkdir -p "$OUT"
.venv/bin/python - "$OUT/bf16-warmstart" <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from rao_core.models.locate import SHIPPED
src = SHIPPED / "small-warmstart"
AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(src).save_pretrained(sys.argv[1])
PY
GPU=(--set "runs_dir=$OUT" --set policy.kind=vllm --set policy.device=cuda --set train.device=cuda
     --set policy.gpu_memory_utilization=0.3 --set campaign.rounds=2 --set rollout.num_tasks=4
     --set eval.num_tasks=8 --set eval.trees_to_render=0 --set tracking.log_checkpoints=false)
time .venv/bin/rao train "${GPU[@]}" --set run_name=bf16 --set "policy.model=$OUT/bf16-warmstart" \
  --set policy.dtype=bfloat16 --set policy.vllm_during_train=sleep --set policy.weight_check_tolerance=0.05 \
  --set train.lr=3e-6
time .venv/bin/rao train "${GPU[@]}" --set run_name=lora --set policy.model=small-warmstart \
  --set policy.dtype=float32 --set train.lora=true --set train.lr=1e-3
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
m = lambda run, v: json.loads((out / run / f"checkpoints/version={v}/metrics.json").read_text())
b1, b2, l1, l2 = m("bf16", 1), m("bf16", 2), m("lora", 1), m("lora", 2)
assert b2["device"].startswith("cuda") and b2["served_dtype"] == "bfloat16", b2["device"]
print(f"bf16: served weights changed since v0 {b1['served_changed_total']:.2%} -> {b2['served_changed_total']:.2%}, "
      f"update/weight RMS {b2['update_rms_ratio']:.2e}, peak GPU {b2['peak_gpu_mib']:.0f} MiB")
assert b2["served_changed_total"] > b1["served_changed_total"], "updates do not accumulate"
assert (out / "bf16/checkpoints/version=2/trainer_state/master/config.json").is_file()
log = (out / "bf16/logs/vllm.log").read_text()
assert log.count("Starting vLLM server") == 1, "the server restarted instead of sleeping and reloading"
total = b2["gpu_total_gib"]
print(f"free GPU memory when the trainer started: {b2['gpu_free_gib_at_start']:.1f} of {total:.1f} GiB")
assert b2["gpu_free_gib_at_start"] > (1 - 0.3) * total + 0.15 * total, "vLLM kept its share while training"
assert (out / "lora/checkpoints/version=2/adapter_config.json").is_file() and l2["resumed_optimizer"]
print(f"lora: |sampler - trainer| log-prob mean {l2['logprob_diff_mean']:.2e} p99 {l2['logprob_diff_p99']:.2e}, "
      f"peak GPU {l2['peak_gpu_mib']:.0f} MiB (full fine-tuning of the same model: {b2['peak_gpu_mib']:.0f} MiB)")
assert l2["logprob_diff_mean"] < 1e-3, l2["logprob_diff_mean"]
lora_log = (out / "lora/logs/vllm.log").read_text()
assert lora_log.count("Starting vLLM server") == 1 and "Loaded new LoRA adapter" in lora_log
print("eval v2:", json.loads((out / "bf16/eval/version=2/summary.json").read_text())["all"]["success"])
PY
echo "GPU check passed"
