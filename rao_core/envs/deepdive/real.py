"""The real DeepDive questions (`zai-org/DeepDive`) from local disk; nothing is downloaded.

Accepted at `suite_args.real_path`:
- the dataset folder as the Hub lays it out (`data/qa_rl-00000-of-00001.parquet`, ...), read for
  the split `suite_args.real_split` (qa_rl: 2,234 rows, qa_sft: 1,016);
- one `.parquet`, `.jsonl` or `.json` file (a list of rows, or {"data": [rows]}).
Rows need string fields `question` and `answer`; `id` is kept when present (the Hub rows also carry
`conversations`, ignored here). Real questions have no graph behind them: their hop count is
unknown, so they all get difficulty "hard" (set rollout.difficulty / eval.difficulty to hard), roots
are scored by exact match (or the judge, see env.py), and searching them needs a real backend.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq

from rao_core.config import ConfigError
from rao_core.envs.args import DeepDiveArgs
from rao_core.envs.deepdive.questions import Task

REAL_DIFFICULTY = "hard"


def _rows(path: Path, split: str) -> list[dict]:
    if path.is_dir():
        files = sorted(path.glob(f"data/{split}-*.parquet")) or sorted(path.glob(f"{split}*.parquet"))
        files = files or sorted(path.glob(f"{split}*.jsonl")) or sorted(path.glob(f"{split}*.json"))
        if not files:
            raise ConfigError(f"suite_args.real_path: no {split} files (data/{split}-*.parquet) in {path}")
        return [row for f in files for row in _rows(f, split)]
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path).to_pylist()
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            return data["data"] if isinstance(data, dict) and "data" in data else data
    except (OSError, ValueError, KeyError) as e:  # pyarrow and json errors are ValueErrors
        raise ConfigError(
            f"suite_args.real_path: cannot read {path}: {type(e).__name__}: {str(e)[:120]}"
        ) from e
    raise ConfigError(f"suite_args.real_path: {path}: expected a .parquet, .jsonl or .json file or a folder")


def load_real(cfg: DeepDiveArgs) -> list[Task]:
    """Every row as a Task, split train/val by a seeded shuffle (val_fraction held out)."""
    path = Path(cfg.real_path).expanduser()
    if not path.exists():
        raise ConfigError(f"suite_args.real_path: no such file or folder: {path}")
    rows = _rows(path, cfg.real_split)
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"suite_args.real_path: {path}: no rows")
    for i, r in enumerate(rows):
        if (
            not isinstance(r, dict)
            or not isinstance(r.get("question"), str)
            or not isinstance(r.get("answer"), str)
        ):
            found = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise ConfigError(
                f"suite_args.real_path: row {i} needs string fields question and answer (found {found})"
            )
    order = list(range(len(rows)))
    random.Random(f"deepdive-real:{cfg.seed}").shuffle(order)
    n_val = round(cfg.val_fraction * len(rows))
    val = set(order[:n_val])
    return [
        Task(
            f"ddr-{r.get('id', i)}",
            r["question"].strip(),
            r["answer"].strip(),
            REAL_DIFFICULTY,
            0,
            "val" if i in val else "train",
            source="real",
        )  # fmt: skip
        for i, r in enumerate(rows)
    ]
