"""scripts/gpu_check.sh's results: what each part left in OUT, in one JSON (OUT/results.json).

    python scripts/gpu_check_results.py OUT MODE SECONDS

Per part: verdict (ok, failed, timeout, skipped), seconds, rc, and the figures the part produced:
env (versions, CUDA, the GPU), pytest-gpu (the counts of its files' closing lines, summed, and the
files that timed out), rao-train (per version: the train step's metrics; the rollout; the
evaluations), real-size (scripts/real_size_cuda.py's JSON), the benches and install-offline (their
printed lines).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

TRAIN_KEYS = ("device", "bf16", "seconds", "stage_seconds", "tokens", "action_tokens", "steps", "loss",
              "served_changed", "served_changed_total", "served_dtype", "update_rms_ratio", "peak_gpu_mib",
              "peak_rss_mib", "gpu_free_gib_at_start", "gpu_total_gib", "lr")  # fmt: skip


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"unreadable": f"{path}: {e}"}


def tail(path: Path, n: int = 15) -> list[str]:
    """The last lines a part printed, without progress bars."""
    if not path.is_file():
        return []
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in path.read_text(errors="replace").splitlines()]
    return [line for line in lines if line and "it/s]" not in line and not line.startswith("USDT:")][-n:]


def run_figures(run: Path) -> dict:
    out: dict = {"run_dir": str(run), "versions": {}, "rollouts": {}, "evals": {}}
    for m in sorted(run.glob("checkpoints/version=*/metrics.json")):
        d = load(m)
        out["versions"][m.parent.name] = {k: d[k] for k in TRAIN_KEYS if k in d}
    for c in sorted(run.glob("rollouts/round=*/_COMPLETE")):
        out["rollouts"][c.parent.name] = load(c)
    for c in sorted(run.glob("eval/version=*/summary.json")):
        out["evals"][c.parent.name] = load(c).get("all")
    return out


def figures(name: str, out: Path) -> dict:
    log = out / "logs" / f"{name}.log"
    if name == "env" and (out / "env.json").is_file():
        return load(out / "env.json")
    if name == "pytest-gpu":  # one closing line per test file: their counts summed
        closing = [line for line in tail(log, 10**6) if re.match(r"=* *\d+ (passed|skipped|failed|deselected|error).* in [\d.]+s", line)]  # fmt: skip
        counts: dict = {}
        for line in closing:
            for n, word in re.findall(r"(\d+) (\w+)", line.split(" in ")[0]):
                counts[word] = counts.get(word, 0) + int(n)
        return counts | {
            "closing_lines": closing,
            "timeouts": [line for line in tail(log, 10**6) if "timed out after" in line],
        }
    if name == "rao-train" and (out / "runs" / "train").is_dir():
        return run_figures(out / "runs" / "train")
    if name == "real-size":
        return {f.stem: load(f) for f in sorted((out / "real-size").glob("real_size_*.json"))}
    return {"lines": tail(log)}


def main() -> None:
    out, mode, seconds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    parts = {}
    for line in (out / "parts.tsv").read_text().splitlines():
        name, verdict, took, rc, why = line.split("\t")
        parts[name] = {"verdict": verdict, "seconds": int(took), "rc": None if rc == "-" else int(rc)}
        parts[name] |= {"why": why} if why else {"figures": figures(name, out)}
    result = {"mode": mode, "seconds": seconds, "commit": commit or None, "parts": parts}
    dest = out / "results.json"
    dest.write_text(json.dumps(result, indent=2, default=str))
    print("=== parts: " + ", ".join(f"{n} {p['verdict']} ({p['seconds']}s)" for n, p in parts.items()))
    print(f"=== results -> {dest} ({seconds}s in all)")


if __name__ == "__main__":
    main()
