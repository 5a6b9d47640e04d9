"""Loader for the real Oolong data on local disk (oolongbench/oolong-real, config `dnd`).

Rows carry `context_window_text` (one to three episode transcripts), `question` and `answer`, as
the dataset's .jsonl files do (a .json list or Parquet shards with those columns work too); a
folder is read file by file in name order. Answers become the scorer's types: an int (or a string
of digits) -> int, a JSON list (or the string of one) -> list of strings, anything else -> string.
Difficulty comes from the estimated length: the configured bucket nearest in ratio (the real
55K-175K-token contexts all land in the largest). Anything unreadable stops with one line.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rao_core.config import ConfigError
from rao_core.envs.args import OolongArgs
from rao_core.envs.oolong.tasks import Task

FIELDS = ("context_window_text", "question", "answer")
SUFFIXES = (".jsonl", ".json", ".parquet")


def _fail(why: str) -> ConfigError:
    return ConfigError(f"suite_args.real_path: {why}")


def _read(path: Path) -> list[dict]:
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path).to_pylist()
        text = path.read_text()
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except (OSError, ValueError) as e:  # JSONDecodeError and ArrowInvalid are ValueErrors
        raise _fail(f"cannot read {path}: {str(e).splitlines()[0]}") from None
    return data if isinstance(data, list) else data.get("data", []) if isinstance(data, dict) else []


def parse_answer(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, list):
        return [str(x) for x in value]
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if text.startswith("[") and text.endswith("]"):
        try:
            return [str(x) for x in ast.literal_eval(text)]
        except (ValueError, SyntaxError):
            pass
    return text


def difficulty_of(chars: int, cfg: OolongArgs) -> tuple[str, int]:
    """(difficulty, estimated tokens): the configured bucket nearest to the length, in log ratio."""
    tokens = max(1, round(chars / cfg.chars_per_token))
    pairs = [(d, n) for d, sizes in cfg.difficulty_tokens.items() for n in sizes]
    difficulty = min(pairs, key=lambda p: abs(math.log(tokens / p[1])))[0]
    return difficulty, tokens


def load_real(path: Path, cfg: OolongArgs) -> list[Task]:
    """Every row of the file or folder as a val task."""
    if not path.exists():
        raise _fail(f"{path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES) if path.is_dir() else [path]
    if not files or any(p.suffix not in SUFFIXES for p in files):
        raise _fail(f"{path}: expected a {', '.join(SUFFIXES)} file or a folder holding them")
    tasks = []
    for f in files:
        for i, row in enumerate(_read(f)):
            missing = [k for k in FIELDS if not isinstance(row, dict) or k not in row]
            if missing:
                raise _fail(f"{f} row {i} lacks {', '.join(missing)} (oolong-real dnd rows have {FIELDS})")
            text = str(row["context_window_text"])
            difficulty, tokens = difficulty_of(len(text), cfg)
            task_id = f"oolong-real-{f.stem}-{row.get('id', i)}"
            answer = parse_answer(row["answer"])
            tasks.append(
                Task(task_id, "val", difficulty, tokens, "real", "", str(row["question"]), answer, text)
            )
    if not tasks:
        raise _fail(f"{path} holds no rows")
    return tasks
