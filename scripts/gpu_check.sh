#!/usr/bin/env bash
# The GPU check, run from an offline install (make install-offline, docs/gpu.md): no registry, no vLLM.
#   bash scripts/gpu_check.sh              on a GPU machine: DEVICE=cuda, at most BUDGET=480 seconds
#   bash scripts/gpu_check.sh --dry-run    on a CPU: DEVICE=cpu, tiny sizes, at most 300 seconds (CI runs it)
# Parts, each under its own `timeout` capped by what is left of BUDGET; one that fails or times out
# does not stop the next:
#   env            the machine, the versions, CUDA, the `rao` entry point and its suites, `rao doctor`
#   pytest-gpu     the gpu tier, pytest -m gpu (skipped without CUDA; pytest's 5, nothing selected, is ok)
#   rao-train      `rao train`, 1 round, on a bf16 copy of the shipped small-warmstart at lr 3e-6
#   real-size      one round at Qwen3-0.6B's shapes through the transformers engine (scripts/real_size_cuda.py):
#                  sampled tokens/s with 32 tasks x G=4 = 128 trees in flight; the train step against the
#                  memory plan
#   rollout-bench  bench/rollout_bench.py on the device
#   decode-bench   bench/decode_bench.py on the device, where the file exists
# Results: $OUT/results.json (each part's verdict, seconds, rc and figures); each part's log in $OUT/logs/.
# Settings: PY (default .venv/bin/python), OUT (default runs/gpu-check), DEVICE, BUDGET, PARTS (a rerun
# of some: PARTS="real-size rollout-bench"), EXTRA_SETS (more KEY=VALUE settings for the parts that run
# the pipeline, e.g. EXTRA_SETS=sandbox.seccomp=false where the sandbox cannot load libseccomp).
set -u -o pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SELF")/.."
sets() { SETS=(); for s in "$@" $EXTRA_SETS; do SETS+=(--set "$s"); done; }  # -> "${SETS[@]}"

p_env() {
  nvidia-smi 2>/dev/null || echo "(no nvidia-smi)"
  "$PY" - "$OUT/env.json" <<'PY'
import json, platform, shutil, sys, importlib.metadata as md
from pathlib import Path
import torch
names = ["torch", "transformers", "trl", "accelerate", "peft", "prefect", "mlflow", "duckdb", "pyarrow", "numpy",
         "pandas", "huggingface_hub", "tokenizers", "safetensors", "pyseccomp", "pytest", "vllm"]
def version(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return None
env = {"python": platform.python_version(), "executable": sys.executable, "versions": {n: version(n) for n in names},
       "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
       "rao_entry_point": shutil.which("rao", path=str(Path(sys.executable).parent)),
       "rao_suites": sorted(e.name for e in md.entry_points(group="rao.suites"))}
if torch.cuda.is_available():
    env["gpu"] = torch.cuda.get_device_name(0)
    env["gpu_total_gib"] = round(torch.cuda.mem_get_info()[1] / 2**30, 1)
print(json.dumps(env, indent=1))
Path(sys.argv[1]).write_text(json.dumps(env, indent=1))
PY
  sets policy.kind=hf policy.device="$DEVICE" train.device="$DEVICE" tracking.enabled=$TRACKING
  "$PY" -m flows.cli doctor "${SETS[@]}"
}

p_pytest_gpu() {  # the test files that mark tests gpu, less those importing what this install lacks
  local files m
  files=$(grep -rl "pytest.mark.gpu" tests --include="*.py" | grep -v conftest.py | sort)
  for m in mlflow ray hypothesis peft; do
    [ -n "$files" ] && ! "$PY" -c "import $m" 2>/dev/null && files=$(grep -LE "^(import|from) $m\b" $files)
  done
  [ -z "$files" ] && echo "no test file marks tests gpu" && return 0
  echo "gpu tier:" $files
  "$PY" -m pytest -m gpu -q -p no:cacheprovider -o addopts= --timeout 300 $files
  local rc=$?
  ((rc == 5)) && echo "pytest -m gpu: no test selected (rc 5)" && return 0
  return $rc
}

p_rao_train() {
  "$PY" - "$OUT/bf16-warmstart" <<'PY' || return 1
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from rao_core.models.locate import SHIPPED
src = SHIPPED / "small-warmstart"
AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(src).save_pretrained(sys.argv[1])
print("bf16 copy of small-warmstart ->", sys.argv[1])
PY
  local size=(rollout.num_tasks=1 rollout.group_size=4 eval.num_tasks=2)
  ((DRY)) && size=(rollout.num_tasks=1 rollout.group_size=2 eval.num_tasks=1 policy.engine_processes=0)
  sets runs_dir="$OUT/runs" run_name=train policy.model="$OUT/bf16-warmstart" policy.kind=hf \
    policy.device="$DEVICE" train.device="$DEVICE" policy.dtype=bfloat16 train.lr=3e-6 campaign.rounds=1 \
    eval.trees_to_render=0 scoring.zero_advantage_groups=keep tracking.enabled=$TRACKING \
    tracking.log_checkpoints=false "${size[@]}"
  "$PY" -m flows.cli train "${SETS[@]}"
}

p_real_size() {
  local size=(--shape 0.6b --tasks 32 --group 4)
  ((DRY)) && size=(--shape tiny --tasks 1 --group 2)
  sets
  "$PY" scripts/real_size_cuda.py --out "$OUT/real-size" --device "$DEVICE" "${size[@]}" "${SETS[@]}"
}

p_rollout_bench() {
  local size=()
  ((DRY)) && size=(rollout.num_tasks=1 rollout.group_size=2 agent.max_steps=4)
  sets policy.device="$DEVICE" "${size[@]}"
  "$PY" bench/rollout_bench.py --runs-dir "$OUT/bench" "${SETS[@]}"
}

p_decode_bench() {
  "$PY" bench/decode_bench.py --device "$DEVICE"
}

if [ "${1:-}" = __part ]; then "$2"; exit $?; fi  # one part, run by `part` below under its timeout

die() { echo "gpu_check: $*"; exit 2; }
export DRY=0
[ "${1:-}" = --dry-run ] && DRY=1
[ $# -gt 0 ] && [ "$1" != --dry-run ] && echo "usage: bash scripts/gpu_check.sh [--dry-run]" && exit 2
export PY=${PY:-.venv/bin/python} OUT=${OUT:-runs/gpu-check} EXTRA_SETS=${EXTRA_SETS:-}
export PARTS=${PARTS:-env pytest-gpu rao-train real-size rollout-bench decode-bench}
if ((DRY)); then
  export DEVICE=${DEVICE:-cpu} BUDGET=${BUDGET:-300}
else
  export DEVICE=${DEVICE:-cuda} BUDGET=${BUDGET:-480}
fi
"$PY" -c "import rao_core" 2>/dev/null || die "$PY cannot import rao_core (make install-offline, or PY=)"
[ -e "$OUT" ] && [ ! -f "$OUT/parts.tsv" ] && die "OUT=$OUT is not an earlier check's folder: not removing it"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 MLFLOW_ENABLE_ASYNC_LOGGING=false
export PREFECT_HOME=${PREFECT_HOME:-$PWD/.prefect} PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
export TRACKING=false  # MLflow is optional: the pipeline runs without it (tracking.enabled=false)
"$PY" -c "import mlflow" 2>/dev/null && TRACKING=true

START=$(date +%s)
# part NAME MAX MIN: run p_NAME under timeout min(MAX, what is left of BUDGET); skipped with under MIN left
part() {
  local name=$1 max=$2 min=$3 lim rc t0 verdict=ok left=$((BUDGET - ($(date +%s) - START)))
  [[ " $PARTS " == *" $name "* ]] || return 0
  lim=$((left < max ? left : max))
  if ((lim < min)); then
    echo "=== $name: skipped (${left}s left of the ${BUDGET}s budget)"
    printf '%s\tskipped\t0\t-\tonly %ss left of the budget\n' "$name" "$left" >>"$OUT/parts.tsv"
    return
  fi
  echo "=== $name: start (timeout ${lim}s, $(($(date +%s) - START))s into the check)"
  t0=$(date +%s)
  timeout -k 10 "$lim" bash "$SELF" __part "p_${name//-/_}" </dev/null 2>&1 | tee "$OUT/logs/$name.log"
  rc=${PIPESTATUS[0]}
  ((rc != 0)) && verdict=failed
  ((rc == 124 || rc == 137)) && verdict=timeout
  echo "=== $name: $verdict (rc $rc, $(($(date +%s) - t0))s)"
  printf '%s\t%s\t%s\t%s\t\n' "$name" "$verdict" "$(($(date +%s) - t0))" "$rc" >>"$OUT/parts.tsv"
}

rm -rf "$OUT" && mkdir -p "$OUT/logs" && : >"$OUT/parts.tsv"
echo "gpu_check: $( ((DRY)) && echo dry run, )DEVICE=$DEVICE BUDGET=${BUDGET}s PY=$PY OUT=$OUT tracking=$TRACKING"
if ((DRY)); then  # maxima on 2 CPU cores
  part env 60 10; part pytest-gpu 90 20; part rao-train 150 40; part real-size 60 20; part rollout-bench 90 20
else
  part env 45 10; part pytest-gpu 60 20; part rao-train 150 60; part real-size 120 40; part rollout-bench 60 20
fi
if [ -f bench/decode_bench.py ]; then
  part decode-bench 45 15
elif [[ " $PARTS " == *" decode-bench "* ]]; then
  printf 'decode-bench\tskipped\t0\t-\tbench/decode_bench.py does not exist\n' >>"$OUT/parts.tsv"
fi
"$PY" scripts/gpu_check_results.py "$OUT" "$( ((DRY)) && echo dry-run || echo gpu)" "$(($(date +%s) - START))"
