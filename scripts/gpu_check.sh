#!/usr/bin/env bash
# The GPU check, run from an offline install (make install-offline, docs/gpu.md): no registry, no vLLM.
#   bash scripts/gpu_check.sh              on a GPU machine: DEVICE=cuda, at most BUDGET=540 seconds
#   bash scripts/gpu_check.sh --dry-run    on a CPU: DEVICE=cpu, tiny sizes, at most 360 seconds (CI runs it)
# Parts, in this order, each under its own `timeout` capped by what is left of BUDGET; one that fails or
# times out does not stop the next (the caps, and the dry run's lengths they come from: docs/gpu.md):
#   env            the machine, the versions, CUDA, the `rao` entry point and its suites, `rao doctor`
#   pytest-gpu     the gpu tier, pytest -m gpu, each test file under its own timeout (skipped without CUDA;
#                  pytest's 5, nothing selected, is ok)
#   decode-bench   bench/decode_bench.py at Qwen3-0.6B's shape (dry run: tiny): ops, host time per step and
#                  K/V bookkeeping launches, tokens/s at 128 rows with and without graphs, captures, fallbacks
#   real-size      one round at Qwen3-0.6B's shapes through the transformers engine (scripts/real_size_cuda.py):
#                  32 tasks x G=4 = 128 trees in flight, policy.max_batch_size=128, turns of 256 new tokens;
#                  sampled tokens/s, decode and prefill seconds apart, graph captures and fallbacks; the train
#                  step against the memory plan
#   rao-train      `rao train`, 1 round, on a bf16 copy of the shipped small-warmstart at lr 3e-6
#   rollout-bench  bench/rollout_bench.py on the device
#   install-offline  with WHEELHOUSE (on a GPU, default wheelhouse/ where it exists): `install-offline
#                  KEEP=torch,transformers` by KEEP_PYTHON (default python3, the machine's) into
#                  OUT/venv-keep; then that venv, or else PY, imports transformers, its hub and tokenizers
#                  and the engine with the network off
#   overlap        with 2 or more GPUs: bench/overlap_bench.py, the campaign at campaign.max_staleness 0 and 1
#                  side by side, the engines on cuda:1 and the trainer on cuda:0, and their ratio (a line
#                  saying why it is skipped on one GPU)
# Results: $OUT/results.json (each part's verdict, seconds, rc and figures); each part's log in $OUT/logs/.
# Settings: PY (default .venv/bin/python), OUT (default runs/gpu-check), DEVICE, BUDGET, PARTS (a rerun
# of some: PARTS="real-size rollout-bench"), EXTRA_SETS (more KEY=VALUE settings for the parts that run
# the pipeline, e.g. EXTRA_SETS=sandbox.seccomp=false where the sandbox cannot load libseccomp),
# WHEELHOUSE and KEEP_PYTHON (install-offline).
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

p_pytest_gpu() {  # the test files that mark tests gpu, less those importing what this install lacks, one by one
  local files m f r rc=0
  files=$(grep -rl "pytest.mark.gpu" tests --include="*.py" | grep -v conftest.py | sort)
  for m in mlflow ray hypothesis peft; do
    [ -n "$files" ] && ! "$PY" -c "import $m" 2>/dev/null && files=$(grep -LE "^(import|from) $m\b" $files)
  done
  [ -z "$files" ] && echo "no test file marks tests gpu" && return 0
  echo "gpu tier:" $files
  for f in $files; do
    echo "--- $f (timeout ${FILE_TIMEOUT}s)"
    timeout -k 5 "$FILE_TIMEOUT" "$PY" -m pytest -m gpu -q -p no:cacheprovider -o addopts= -rfE "$f"
    r=$?
    ((r == 5)) && echo "pytest -m gpu $f: no test selected (rc 5)" && r=0
    ((r == 124)) && echo "pytest -m gpu $f: timed out after ${FILE_TIMEOUT}s"
    ((r != 0)) && rc=$r
  done
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
  ((DRY)) && size=(rollout.num_tasks=1 rollout.group_size=2 eval.num_tasks=1 eval.difficulty=medium
    agent.max_steps=4 train.steps_per_round=1 policy.engine_processes=0)
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
  "$PY" scripts/real_size_cuda.py --out "$OUT/real-size" --device "$DEVICE" --rows 128 --new-tokens 256 \
    "${size[@]}" "${SETS[@]}"
}

p_rollout_bench() {
  local size=()
  # dry: the engine in the bench's process, as on a GPU (engine processes are a CPU's; their imports
  # would be most of the part)
  ((DRY)) && size=(rollout.num_tasks=1 rollout.group_size=2 agent.max_steps=4 policy.engine_processes=0)
  sets policy.device="$DEVICE" "${size[@]}"
  "$PY" bench/rollout_bench.py --runs-dir "$OUT/bench" "${SETS[@]}"
}

p_decode_bench() {
  local shape=0.6b
  ((DRY)) && shape=tiny
  "$PY" bench/decode_bench.py --device "$DEVICE" --shape $shape --rows 128
}

p_overlap() {  # k = 0 against k = 1 with the engines and the trainer on two GPUs (docs/overlap.md)
  local gpus
  gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())") || return 1
  if ((gpus < 2)); then
    echo "overlap: skipped: $gpus GPU(s); rounds that overlap put the engines and the trainer on two"
    return 0
  fi
  sets policy.device=cuda:1 train.device=cuda:0 policy.kind=hf eval.num_tasks=16 tracking.enabled=false
  "$PY" bench/overlap_bench.py --rounds 3 "${SETS[@]}"
}

offline() {  # a command with no network: its own network namespace where the kernel allows one
  if unshare -rn true 2>/dev/null; then
    echo "network: none (unshare -rn), and Python's socket connections refused"
    unshare -rn "$@"
  else
    echo "network: Python's socket connections refused (unshare -rn not allowed here)"
    "$@"
  fi
}

p_install_offline() {
  local py=$PY
  if [ -n "${WHEELHOUSE:-}" ]; then
    "$KEEP_PYTHON" scripts/offline_install.py install --dir "$WHEELHOUSE" --venv "$OUT/venv-keep" \
      --keep torch,transformers || return 1
    py=$OUT/venv-keep/bin/python
  else
    echo "no WHEELHOUSE: no install; the import check runs on PY=$PY"
  fi
  offline "$py" - <<'PY'
import socket
def refuse(*a, **k):
    raise OSError("network off (scripts/gpu_check.sh, install-offline)")
socket.socket.connect = socket.socket.connect_ex = socket.create_connection = refuse
import importlib.metadata as md
import huggingface_hub, tokenizers, torch, transformers
from transformers import AutoTokenizer
import rao_core.engines.hf
from rao_core.models.locate import SHIPPED
AutoTokenizer.from_pretrained(SHIPPED / "small-warmstart")
names = ("torch", "transformers", "huggingface_hub", "tokenizers", "safetensors")
print("imported with the network off:", {n: md.version(n) for n in names})
PY
}

if [ "${1:-}" = __part ]; then "$2"; exit $?; fi  # one part, run by `part` below under its timeout

die() { echo "gpu_check: $*"; exit 2; }
export DRY=0
[ "${1:-}" = --dry-run ] && DRY=1
[ $# -gt 0 ] && [ "$1" != --dry-run ] && echo "usage: bash scripts/gpu_check.sh [--dry-run]" && exit 2
export PY=${PY:-.venv/bin/python} OUT=${OUT:-runs/gpu-check} EXTRA_SETS=${EXTRA_SETS:-}
export PARTS=${PARTS:-env pytest-gpu decode-bench real-size rao-train rollout-bench install-offline overlap}
export KEEP_PYTHON=${KEEP_PYTHON:-python3} WHEELHOUSE=${WHEELHOUSE:-}
[ -z "$WHEELHOUSE" ] && ((!DRY)) && [ -d wheelhouse ] && WHEELHOUSE=wheelhouse  # make wheelhouse's default folder
if ((DRY)); then
  export DEVICE=${DEVICE:-cpu} BUDGET=${BUDGET:-360} FILE_TIMEOUT=60
else
  export DEVICE=${DEVICE:-cuda} BUDGET=${BUDGET:-540} FILE_TIMEOUT=150
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
# Caps: on 2 CPU cores, about twice the dry run's longest measured length (docs/gpu.md); on a GPU, the parts
# that do the same work there at 1.5x their dry length, at least 30 s, and the ones that do more (the gpu
# tier, the 0.6B decode bench and round, the install) from their work (docs/gpu.md).
if ((DRY)); then
  part env 30 10; part pytest-gpu 120 20; part decode-bench 60 20; part real-size 60 20; part rao-train 180 40
  part rollout-bench 90 20; part install-offline 30 10; part overlap 30 5
else
  part env 30 10; part pytest-gpu $((2 * FILE_TIMEOUT)) 30; part decode-bench 120 40; part real-size 240 60
  part rao-train 120 60; part rollout-bench 70 20; part install-offline 120 20; part overlap 300 120
fi
"$PY" scripts/gpu_check_results.py "$OUT" "$( ((DRY)) && echo dry-run || echo gpu)" "$(($(date +%s) - START))"
