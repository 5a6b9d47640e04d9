"""Oolong tasks: one transcript + one question each, by length bucket, stored as Parquet.

Buckets are sizes in tokens (suite_args.difficulty_tokens: easy 2K/4K, medium 8K/16K, hard 32K,
extreme 64K by default), turned into characters with suite_args.chars_per_token (4: the usual English
BPE average), so a difficulty means "this much text to aggregate", the way the reference's
55K/118K/175K-token buckets do. Train and val tasks come from disjoint seed streams, so no
validation transcript is ever seen in training. The transcript is stored with the task.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rao_core.envs.args import OolongArgs
from rao_core.envs.oolong.questions import KINDS, make_question
from rao_core.envs.oolong.transcript import generate
from rao_core.store.files import atomic_write

COLUMNS = ("task_id", "split", "difficulty", "bucket_tokens", "kind", "arg", "question", "answer", "context")


@dataclass
class Task:
    task_id: str
    split: str
    difficulty: str
    bucket_tokens: int  # the bucket's nominal size (real rows: the estimated size)
    kind: str  # question kind (questions.KINDS), or "real"
    arg: str
    question: str
    answer: Any  # int, str or list[str]
    context: str


def bucket_chars(tokens: int, cfg: OolongArgs) -> int:
    return int(tokens * cfg.chars_per_token)


def make_tasks(cfg: OolongArgs, split: str) -> list[Task]:
    """cfg.tasks_per_difficulty tasks per difficulty, cycling over its buckets and question kinds."""
    tasks = []
    for difficulty, buckets in cfg.difficulty_tokens.items():
        for i in range(cfg.tasks_per_difficulty):
            tokens = buckets[i % len(buckets)]
            seed = f"{cfg.seed}:{split}:{difficulty}:{i}"
            tr = generate(seed, bucket_chars(tokens, cfg), cfg.speakers)
            q = make_question(random.Random(f"oolong-question:{seed}"), tr, KINDS[i % len(KINDS)])
            task_id = f"oo-{split}-{difficulty}-{i}"
            tasks.append(Task(task_id, split, difficulty, tokens, q.kind, q.arg, q.text, q.answer, tr.text))
    return tasks


def write_tasks(tasks: list[Task], path: Path) -> Path:
    cols = {c: [getattr(t, c) for t in tasks] for c in COLUMNS}
    cols["answer"] = [json.dumps(a) for a in cols["answer"]]
    types = {c: pa.int64() if c == "bucket_tokens" else pa.string() for c in COLUMNS}
    table = pa.table({c: pa.array(v, types[c]) for c, v in cols.items()})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return path


def load_tasks(path: Path) -> list[Task]:
    rows = pq.read_table(path, columns=list(COLUMNS)).to_pylist()
    return [Task(**{**r, "answer": json.loads(r["answer"])}) for r in rows]
