"""`rao warmstart`: run the warm-start stage once into a folder and, optionally, ship it.

    rao warmstart --out runs/ws --set warmstart.give_up_rate=0.15 [--ship rao_core/models/checkpoints/NAME]

The settings are the run configuration's `warmstart.*` section (the same ones a run with
`policy.model=warmstart` trains with). The log of the command is written to <out>/warmstart.log and
shipped with the checkpoint, together with metrics.json, the training log and the command (COMMAND).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from rao_core.config import RunConfig
from rao_core.envs.suites import open_suite
from rao_core.train.warmstart import evaluate_warm_start, summary_line, warm_start


class _Tee:
    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> None:
        for s in self.streams:
            s.write(text)
            s.flush()

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def run_warmstart(
    run: RunConfig, out: Path, command: str, ship_to: Path | None = None, eval_only: bool = False
) -> dict[str, Any]:
    """Train (or, with `eval_only`, only evaluate) into `out`, printing and logging as it goes; the
    suite's data goes to <out>/data."""
    cfg = run.warmstart
    out.mkdir(parents=True, exist_ok=True)
    suite = open_suite(run, out / "data")
    with (out / "warmstart.log").open("a") as log, contextlib.redirect_stdout(_Tee(sys.stdout, log)):
        print(f"$ {command}\nconfig: {json.dumps(dataclasses.asdict(cfg))}", flush=True)
        if eval_only:
            trained = (
                (out / "COMMAND").read_text().strip() if (out / "COMMAND").is_file() else "(trained before)"
            )
            command = f"{trained}\n{command}"
            metrics = evaluate_warm_start(cfg, out, suite, progress=True)
        else:
            (out / "COMMAND").write_text(command + "\n")
            metrics = warm_start(cfg, out, suite, progress=True)
        print(json.dumps({k: v for k, v in metrics.items() if k not in ("config", "eval")}, indent=1))
        if "eval" in metrics:
            print(format_table(metrics["eval"]))
        print(summary_line(cfg, metrics), flush=True)
    if ship_to is not None:
        ship(out, ship_to, command)
    return metrics


def ship(out: Path, dest: Path, command: str) -> None:
    """Copy model + tokenizer, metrics, logs and the command; swap the folder in by renames, so a
    reader (a rollout loading the checkpoint by name) sees the old or the new one, never a mix."""
    tmp, old = dest.parent / f".{dest.name}.new", dest.parent / f".{dest.name}.old"
    for path in (tmp, old):
        shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(out / "model", tmp)
    for name in ("metrics.json", "warmstart.log", "train_log.jsonl"):
        shutil.copy(out / name, tmp / name)
    (tmp / "COMMAND").write_text(command + "\n")
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    print(f"shipped to {dest}")


def format_table(ev: dict[str, Any]) -> str:
    """Markdown: success (95% Wilson interval) by difficulty and mode."""
    modes = list(ev["success"])
    lines = ["| difficulty | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for d in next(iter(ev["success"].values())):
        cells = [ev["success"][m][d] for m in modes]
        row = " | ".join(f"{c['rate']:.0%} [{c['lo']:.0%}, {c['hi']:.0%}] (n={c['n']})" for c in cells)
        lines.append(f"| {d} | {row} |")
    return "\n".join(lines)
