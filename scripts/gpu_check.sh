#!/usr/bin/env bash
# The GPU path end to end, on the tiny model, in under 10 minutes: install both environments (the
# project's, vLLM's CUDA build), then a one-round campaign with vLLM on the GPU (rollouts, one training
# step on the GPU, the reload into the running server with its probe check, one evaluation), then
# the vLLM engine tests. Run it whenever a GPU is available:  bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PREFECT_HOME="$PWD/.prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
OUT=${OUT:-runs/gpu-check}
make install
make vllm VLLM_REQS=requirements/vllm-gpu.txt
.venv/bin/rao doctor --set policy.kind=vllm --set policy.device=cuda --set train.device=cuda
rm -rf "$OUT"
time .venv/bin/rao train --set runs_dir="$OUT" --set run_name=check --set policy.kind=vllm \
  --set policy.dtype=float32 --set policy.device=cuda --set train.device=cuda \
  --set policy.gpu_memory_utilization=0.3 --set campaign.rounds=1 --set rollout.num_tasks=4 \
  --set eval.num_tasks=8 --set tracking.log_checkpoints=false
.venv/bin/python - "$OUT/check" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
m = json.loads((run / "checkpoints/round-1/metrics.json").read_text())
assert m["device"].startswith("cuda"), m["device"]
print(f"train on {m['device']}: loss {m['loss']:.4f}, mean ratio {m['mean_ratio']:.4f}, "
      f"|sampler - trainer| log-prob mean {m['logprob_diff_mean']:.2e} p99 {m['logprob_diff_p99']:.2e}")
log = (run / "logs/vllm.log").read_text()
assert log.count("Starting vLLM server") == 1, "the server restarted instead of reloading"
print("eval v1:", json.loads((run / "eval/round=1/summary.json").read_text())["all"]["success"])
PY
.venv/bin/python -m pytest -p no:cacheprovider -m vllm tests/engines/test_vllm_engine.py
echo "GPU check passed"
