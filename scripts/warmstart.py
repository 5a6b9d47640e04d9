"""Run the warm-start stage once and (optionally) ship its checkpoint into the repository.

    .venv/bin/python scripts/warmstart.py --out runs/warmstart --max_minutes 30 \
        --ship rao_core/models/checkpoints/small-warmstart

Every WarmStartConfig field is a flag (`--help` lists them with their defaults). The log of this
command (stdout) is written to <out>/warmstart.log and shipped with the checkpoint, together with
metrics.json, the training log and the exact command line (COMMAND).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import sys
from pathlib import Path

from rao_core.train.warmstart import WarmStartConfig, evaluate_warm_start, format_table, warm_start


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="work folder (expert data, model/, metrics.json, logs)")
    p.add_argument("--ship", help="copy the checkpoint, metrics, log and command into this folder")
    p.add_argument(
        "--eval_only",
        action="store_true",
        help="only evaluate <out>/model (trained before) into its metrics.json",
    )
    for f in dataclasses.fields(WarmStartConfig):
        kind = type(f.default_factory()) if f.default_factory is not dataclasses.MISSING else type(f.default)
        default = f.default_factory() if kind is list else f.default
        if kind is list:
            p.add_argument(
                f"--{f.name}", nargs="+", default=default, help=f"{f.metadata['help']} ({default})"
            )
        else:
            p.add_argument(
                f"--{f.name}", type=kind, default=default, help=f"{f.metadata['help']} ({default})"
            )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(WarmStartConfig)}
    values = {
        k: [int(x) if str(x).isdigit() else x for x in v] if isinstance(v, list) else v
        for k, v in values.items()
    }
    cfg = WarmStartConfig(**values)
    command = shlex.join([".venv/bin/python", "scripts/warmstart.py", *sys.argv[1:]])
    with (out / "warmstart.log").open("a") as log:
        sys.stdout = _Tee(sys.__stdout__, log)
        print(f"$ {command}\nconfig: {json.dumps(dataclasses.asdict(cfg))}", flush=True)
        if args.eval_only:
            trained = (
                (out / "COMMAND").read_text().strip() if (out / "COMMAND").is_file() else "(trained before)"
            )
            command = f"{trained}\n{command}"
            metrics = evaluate_warm_start(cfg, out, progress=True)
        else:
            (out / "COMMAND").write_text(command + "\n")
            metrics = warm_start(cfg, out, progress=True)
        print(json.dumps({k: v for k, v in metrics.items() if k not in ("config", "eval")}, indent=1))
        if "eval" in metrics:
            print(format_table(metrics["eval"]))
        sys.stdout = sys.__stdout__
    if args.ship:
        ship(out, Path(args.ship), command)


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


if __name__ == "__main__":
    main()
