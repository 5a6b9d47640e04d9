"""A dataset is a suite: tasks with answers from a Parquet file or a Hugging Face `datasets` folder,
scored by a function of yours or by the judge. No class to write:

    suite: dataset
    suite_args:
      path: data/questions.parquet        # or a folder written by Dataset(Dict).save_to_disk
      verifier: mytasks.score:exact       # def exact(answer: str, task: dict) -> float in [0, 1]

Columns: `id` and `goal` (required); `answer` (any JSON value) and/or `targets` (a mapping) for the
verifier; optional `difficulty` (default "all"), `split` (default: a seeded `val_fraction` of the
ids go to "val", the rest to "train"; a DatasetDict's split names are used as they are) and
`context`, a string the node finds in its REPL variable `context` and never in its prompt (as in
the Oolong suite). Sub-agents get a goal and, optionally, a context of their parent's choosing;
they have no exact verifier, so the judge scores them (judge.kind), or they copy the root's
success. Without a verifier the judge scores the root too, against the `answer` column.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from rao_core.envs.base import Environment, LaunchError, ScorerError, Suite, SuiteContext, success_value
from rao_core.envs.registry import import_object
from rao_core.store.files import atomic_write

MAX_GOAL_CHARS = 4000

FINISH_DOCS = """\
- finish(answer): end this node; `answer` (a string) is your final answer.
"""
CONTEXT_DOCS = """\
Your data is the string variable `context` in your REPL. It is NOT in this prompt: look at it with
Python and print only what you need, since long output is cut.
"""
LAUNCH_DOCS = """\
- await launch_subagent(goal: str, context: str = "") -> str: start a sub-agent with a fresh REPL
  whose `context` is the string you pass; returns its finish message. Run several concurrently:
  `results = await asyncio.gather(*(launch_subagent(goal, context=c) for c in chunks))`
"""


class DatasetArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="a .parquet file, or a folder written by datasets' save_to_disk")
    verifier: str = Field(
        "", description="module:function(answer, task) -> float in [0, 1], sync or async; empty: the judge"
    )
    val_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of ids held out when there is no split column"
    )
    seed: int = Field(0, description="seed of the train/val assignment when there is no split column")


class DatasetTask(BaseModel):
    task_id: str
    goal: str
    answer: Any = None
    targets: dict[str, Any] = Field(default_factory=dict)
    difficulty: str = "all"
    split: str = "train"
    context: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """What the verifier sees."""
        return {"id": self.task_id, **self.model_dump(exclude={"task_id"})}


def read_rows(path: str) -> list[dict[str, Any]]:
    """The source's rows; a DatasetDict's rows carry their split name."""
    source = Path(path)
    if source.is_dir():
        from datasets import DatasetDict, load_from_disk

        ds = load_from_disk(str(source))
        if isinstance(ds, DatasetDict):
            return [{"split": name, **row} for name, part in ds.items() for row in part.to_list()]
        return ds.to_list()
    if source.is_file() and source.suffix == ".parquet":
        return pq.read_table(source).to_pylist()
    raise ValueError(f"suite_args.path: {path!r}: not a .parquet file or a datasets folder")


def to_tasks(rows: list[dict[str, Any]], args: DatasetArgs) -> list[DatasetTask]:
    """Rows -> tasks, with a one-line error naming the row and the column that is wrong."""
    tasks, seen = [], set()
    for i, row in enumerate(rows):
        task_id = row.get("id", row.get("task_id"))
        if task_id is None or not str(task_id):
            raise ValueError(f"suite_args.path: row {i}: missing column `id`")
        if not isinstance(row.get("goal"), str) or not row["goal"].strip():
            raise ValueError(f"suite_args.path: row {i} (id {task_id}): `goal` must be a non-empty string")
        if str(task_id) in seen:
            raise ValueError(f"suite_args.path: row {i}: id {task_id!r} appears twice")
        seen.add(str(task_id))
        targets = row.get("targets") or {}
        if isinstance(targets, str):
            targets = json.loads(targets)
        if "split" in row and row["split"] is not None:
            split = str(row["split"])
        else:  # seeded by id alone: adding rows never moves a task between splits
            digest = hashlib.sha256(f"{args.seed}|{task_id}".encode()).digest()
            split = "val" if int.from_bytes(digest[:8], "little") / 2**64 < args.val_fraction else "train"
        tasks.append(
            DatasetTask(
                task_id=str(task_id),
                goal=row["goal"].strip(),
                answer=row.get("answer"),
                targets=targets,
                difficulty=str(row.get("difficulty") or "all"),
                split=split,
                context=row.get("context"),
            )
        )
    if not tasks:
        raise ValueError(f"suite_args.path: {args.path!r}: no rows")
    return tasks


class DatasetEnv(Environment):
    suite = "dataset"

    def __init__(self, task: DatasetTask | None, goal: str, context: str | None, verifier: Any) -> None:
        """A root when `task` is given, else a sub-agent with its parent's goal and context."""
        self.task, self.goal, self.context, self.verifier = task, goal, context, verifier

    def goal_text(self) -> str:
        if self.context is None:
            return self.goal
        return (
            f"{self.goal}\nThe data is in the Python variable `context` ({len(self.context):,} characters)."
        )

    def targets(self) -> dict[str, Any]:
        if self.task is None:
            return {"goal": self.goal}
        return {"answer": self.task.answer, **self.task.targets}

    def tools(self) -> dict[str, Any]:
        return {}

    def tool_docs(self, recursive: bool) -> str:
        return (
            (CONTEXT_DOCS if self.context is not None else "")
            + FINISH_DOCS
            + (LAUNCH_DOCS if recursive else "")
        )

    def fork(self, goal: Any = None, context: Any = "") -> DatasetEnv:
        if not isinstance(goal, str) or not goal.strip():
            raise LaunchError("goal must be a non-empty string")
        if len(goal) > MAX_GOAL_CHARS:
            raise LaunchError(
                f"goal has {len(goal)} characters (at most {MAX_GOAL_CHARS}): pass data as context="
            )
        if not isinstance(context, str):
            raise LaunchError("context must be a string")
        return DatasetEnv(None, goal.strip(), context or None, None)

    async def success(self, finished: bool, finish_message: str) -> float:
        """The verifier's score for a root that finished; 0 otherwise. Without a verifier (or for a
        sub-agent) a finished node scores 1 here and the judge's verdict replaces it."""
        if not finished:
            return 0.0
        if self.task is None or self.verifier is None:
            return float(bool(finish_message.strip()))
        name = f"suite dataset's verifier {self.verifier.__module__}:{self.verifier.__qualname__}"
        try:
            score = self.verifier(finish_message, self.task.as_dict())
            if inspect.isawaitable(score):
                score = await score
        except Exception as e:
            raise ScorerError(f"{name} raised {type(e).__name__}: {e}") from e
        return success_value(score, name)

    def judge_inputs(self, finished: bool, finish_message: str) -> dict[str, str] | None:
        if not finished or (self.task is not None and self.verifier is not None):
            return None
        out = {"goal": self.goal, "answer": finish_message}
        if self.task is not None and self.task.answer is not None:
            out["reference"] = (
                json.dumps(self.task.answer) if not isinstance(self.task.answer, str) else self.task.answer
            )
        return out

    def context_chars(self) -> int:
        return len(self.context or "")

    def reference_answer(self) -> str | None:
        """The row's `answer` as a root would finish with it (`finish(answer)` sends str(answer))."""
        return None if self.task is None or self.task.answer is None else str(self.task.answer)

    def repl_variables(self) -> dict[str, Any]:
        return {} if self.context is None else {"context": self.context}


def verifier(args: DatasetArgs) -> Any:
    """The verifier function suite_args.verifier names (None when it names none)."""
    if not args.verifier:
        return None
    fn = import_object(args.verifier, "suite_args.verifier")
    if not callable(fn):
        raise ValueError(f"suite_args.verifier: {args.verifier!r}: not a function")
    return fn


class DatasetSuite(Suite):
    """Tasks read from a dataset (suite_args.path), copied once into the run's data folder so a
    run keeps the tasks it started with."""

    files = ("tasks.parquet",)
    Args = DatasetArgs
    reads = frozenset({"warmstart.demonstrator"})

    @classmethod
    def labels(cls, args: DatasetArgs) -> tuple[tuple[str, ...], tuple[str, ...]]:
        tasks = to_tasks(read_rows(args.path), args)
        return tuple(dict.fromkeys(t.split for t in tasks)), tuple(dict.fromkeys(t.difficulty for t in tasks))

    @classmethod
    def defaults(cls, args: DatasetArgs) -> list[dict]:
        """Roll out and evaluate every difficulty the data has; evaluate on val (or the split that
        is not train)."""
        splits, difficulties = cls.labels(args)
        held_out = "val" if "val" in splits else next((s for s in splits if s != "train"), splits[0])
        train = "train" if "train" in splits else splits[0]
        return [
            {
                "rollout": {"split": train, "difficulty": list(difficulties)},
                "eval": {"split": held_out, "difficulty": list(difficulties)},
            }
        ]

    @classmethod
    def check(cls, ctx: SuiteContext, args: DatasetArgs) -> None:
        verifier(args)
        if not args.verifier and ctx.judge.kind == "none":
            raise ValueError(
                "suite_args.verifier: needed when judge.kind is none (nothing else can score the roots)"
            )

    def __init__(self, ctx: SuiteContext, args: DatasetArgs) -> None:
        super().__init__(ctx, args)
        self.verifier = verifier(args)
        self.by_split: dict[str, list[DatasetTask]] = {}

    def synthesize(self, out: Path) -> None:
        tasks = to_tasks(read_rows(self.args.path), self.args)
        rows = [
            t.model_dump() | {"answer": json.dumps(t.answer), "targets": json.dumps(t.targets)} for t in tasks
        ]
        atomic_write(out / "tasks.parquet", lambda tmp: pq.write_table(pa.Table.from_pylist(rows), tmp))

    def open(self, data_dir: Path) -> None:
        super().open(data_dir)
        for row in pq.read_table(data_dir / "tasks.parquet").to_pylist():
            task = DatasetTask(
                **(row | {"answer": json.loads(row["answer"]), "targets": json.loads(row["targets"])})
            )
            self.by_split.setdefault(task.split, []).append(task)

    def tasks(self, split: str) -> list[DatasetTask]:
        return self.by_split.get(split, [])

    def env(self, task: DatasetTask) -> DatasetEnv:
        return DatasetEnv(task, task.goal, task.context, self.verifier)

    def demonstrator(self, ws: Any) -> Any:
        """The user's demonstrator (warmstart.demonstrator) as a scripted policy; None without one."""
        if not ws.demonstrator:
            return None
        from rao_core.envs.demonstrator import CellsDemonstrator

        fn = import_object(ws.demonstrator, "warmstart.demonstrator")
        if not callable(fn):
            raise ValueError(f"warmstart.demonstrator: {ws.demonstrator!r}: not a function")
        return CellsDemonstrator(fn, ws.demonstrator, self.ctx.agent.reply_format)
