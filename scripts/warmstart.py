"""Kept for the shipped checkpoints' COMMAND files: `scripts/warmstart.py --out D --give_up_rate 0.15`
is `rao warmstart --out D --set warmstart.give_up_rate=0.15` (every `--field value` becomes
`--set warmstart.field=value`; `--ship`, `--eval_only` and `--out` pass through)."""

from __future__ import annotations

import sys

from flows.cli import main

PASS = {"--out": "--out", "--ship": "--ship", "--eval_only": "--eval-only", "--help": "--help", "-h": "-h"}


def translate(argv: list[str]) -> list[str]:
    out, i = ["warmstart"], 0
    while i < len(argv):
        flag = argv[i]
        values = []
        while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values.append(argv[i + 1])
            i += 1
        i += 1
        if flag in PASS:
            out += [PASS[flag], *values]
        else:
            value = values[0] if len(values) == 1 else "[" + ", ".join(values) + "]"
            out += ["--set", f"warmstart.{flag.removeprefix('--')}={value}"]
    return out


if __name__ == "__main__":
    sys.exit(main(translate(sys.argv[1:])))
