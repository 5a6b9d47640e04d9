"""File counting, a task suite written outside rao_core: count the files of one kind under a folder
of a generated nested folder tree. It uses only rao_core's public interface (Suite, Environment,
Policy), and is loaded by import path: `suite: examples.filecount.suite:FileCount`.

    goal: count log files
    ls()      ->  log 3; subfolders 0 1     (this node's folder)
    ls(1, 0)  ->  log 0; no subfolders      (the first subfolder of the second subfolder)
    sub(0)    ->  '4'                  (a sub-agent counts in subfolder 0 and finishes with 4)
    finish(3 + int(sub(0)) + int(sub(1)))

Why delegating pays: a node has `agent.max_steps` turns (8 in config.yaml). Counting inline takes
one `ls` per folder and a sum of numbers read far back in the context, so a hard tree (about 10
folders, 3 levels) does not fit in one node; with one sub-agent per subfolder every node takes 2
turns and reads one number, however big the tree is.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from rao_core.envs.base import Environment, LaunchError, Suite
from rao_core.policy import Generation, GenerationRequest, NodeState, Policy

KINDS = ("log", "txt", "py")
DEPTHS = {"easy": 1, "medium": 2, "hard": 3}  # levels of subfolders under the task's folder
VAL_SEED_BASE = 1_000_000  # val trees are drawn from seeds no train tree uses
DOCS = "ls(): your folder's count and subfolders; ls(i, j): subfolder j of subfolder i, and so on."
SUB_DOCS = " sub(i): a sub-agent counts in subfolder i; int(sub(i)) is its count."
FINISH_DOCS = " finish(n): the total."


# --- the data: one folder tree per task ---------------------------------------------------------
def make_tree(seed: int, depth: int) -> dict[str, Any]:
    """{name: {"dirs": [...], "log": n, "txt": n, "py": n}} for every folder, the root first."""
    rng = random.Random(f"filecount:{seed}:{depth}")
    names = rng.sample([f"{c}{i}" for c in "abcdefghkmnprstw" for i in range(1, 100)], 64)
    folders: dict[str, Any] = {}

    def folder(level: int) -> str:
        name = names[len(folders)]
        folders[name] = {kind: rng.randint(0, 3) for kind in KINDS} | {"dirs": []}
        if level < depth:
            for _ in range(2 if level == 0 else rng.randint(1, 2)):
                folders[name]["dirs"].append(folder(level + 1))
        return name

    folder(0)
    return folders


def count(folders: dict[str, Any], name: str, kind: str) -> int:
    return folders[name][kind] + sum(count(folders, d, kind) for d in folders[name]["dirs"])


class Task(BaseModel):
    task_id: str
    split: str
    difficulty: str
    kind: str
    folders: dict[str, Any]

    @property
    def root(self) -> str:
        return next(iter(self.folders))


def make_task(seed: int, difficulty: str, split: str) -> Task:
    kind = random.Random(f"kind:{seed}").choice(KINDS)
    return Task(task_id=f"{split}-{difficulty}-{seed}", split=split, difficulty=difficulty, kind=kind,
                folders=make_tree(seed, DEPTHS[difficulty]))  # fmt: skip


# --- the environment ----------------------------------------------------------------------------
class FileCountEnv(Environment):
    suite = "filecount"
    launch_tool = "sub"
    launch_async = False  # a blocking call, one child at a time: short cells for a tiny model
    repl_echo = True  # a bare `ls()` prints its result

    def __init__(self, folders: dict[str, Any], folder: str, kind: str) -> None:
        self.folders, self.folder, self.kind = folders, folder, kind

    def goal_text(self) -> str:
        return f"count {self.kind} files"

    def targets(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "kind": self.kind,
            "count": count(self.folders, self.folder, self.kind),
        }

    def tools(self) -> dict[str, Any]:
        return {"ls": self.ls}

    def tool_docs(self, recursive: bool) -> str:
        return DOCS + (SUB_DOCS if recursive else "") + FINISH_DOCS

    def walk(self, path: tuple[Any, ...]) -> str | None:
        """The folder at `path` (subfolder indices) below this node's folder, or None."""
        name = self.folder
        for i in path:
            dirs = self.folders[name]["dirs"]
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(dirs):
                return None
            name = dirs[i]
        return name

    def ls(self, *path: Any) -> str:
        name = self.walk(path)
        if name is None:
            return f"no folder at {list(path)}"[:40]
        f = self.folders[name]
        subs = " ".join(map(str, range(len(f["dirs"])))) if f["dirs"] else ""
        return f"{self.kind} {f[self.kind]}; " + (f"subfolders {subs}" if subs else "no subfolders")

    def fork(self, index: Any = None, *args: Any, **kwargs: Any) -> FileCountEnv:
        name = self.walk((index,)) if not (args or kwargs) else None
        if name is None:
            raise LaunchError(
                f"sub takes a subfolder index, 0 to {len(self.folders[self.folder]['dirs']) - 1}"
            )
        return FileCountEnv(self.folders, name, self.kind)

    def success(self, finished: bool, finish_message: str) -> float:
        """Every node is verified exactly: its count of its own folder."""
        return float(finished and finish_message.strip() == str(count(self.folders, self.folder, self.kind)))


# --- the scripted expert ------------------------------------------------------------------------
class FileCountExpert(Policy):
    """recursive: ls() -> finish(n + int(sub(0)) + int(sub(1)))
    flat:      ls() of every folder below, one a turn (ls(0), ls(0, 1), ...) -> finish(the sum)
    A share `inline_rate` of recursive roots walk their tree flat instead: a warm start that
    rarely delegates at the root, for RL to teach it to."""

    def __init__(self, inline_rate: float = 0.0) -> None:
        self.inline_rate = inline_rate

    async def generate(self, request: GenerationRequest) -> Generation:
        return Generation(text=f"<python>\n{self.next_cell(request.node)}\n</python>")

    def next_cell(self, node: NodeState) -> str:
        env: FileCountEnv = node.env  # type: ignore[assignment]
        memory = node.memory
        if "flat" not in memory:
            inline = node.depth == 0 and self.inline_rate > 0 and node.rng.random() < self.inline_rate
            memory["flat"] = inline or not node.recursive or node.depth >= node.max_depth
        todo: list[tuple[int, ...]] = memory.setdefault("todo", [()])
        counts: list[int] = memory.setdefault("counts", [])
        if "listed" in memory:  # the last cell was ls(*path)
            path = memory.pop("listed")
            f = env.folders[env.walk(path)]
            counts.append(f[env.kind])
            if memory["flat"]:
                todo.extend((*path, i) for i in range(len(f["dirs"])))
            else:
                terms = [str(counts[0]), *(f"int(sub({i}))" for i in range(len(f["dirs"])))]
                return f"finish({' + '.join(terms)})"
        if todo:
            memory["listed"] = todo.pop(0)
            return f"ls({', '.join(map(str, memory['listed']))})"
        return f"finish({' + '.join(map(str, counts))})"


# --- the suite ----------------------------------------------------------------------------------
class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks_per_difficulty: int = Field(200, ge=1, description="tasks per difficulty and split")
    seed: int = Field(0, description="seed of the folder trees")


class FileCount(Suite):
    difficulties = tuple(DEPTHS)
    Args = Args
    files = ("train.parquet", "val.parquet")
    reads = frozenset({"warmstart.root_inline_rate"})  # what demonstrator() below reads

    def synthesize(self, out: Path) -> None:
        for split, base in (("train", 0), ("val", VAL_SEED_BASE)):
            n = self.args.tasks_per_difficulty
            tasks = [
                make_task(base + self.args.seed * 10_000 + i, d, split) for d in DEPTHS for i in range(n)
            ]
            rows = [t.model_dump() | {"folders": json.dumps(t.folders)} for t in tasks]
            pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")

    def open(self, data_dir: Path) -> None:
        super().open(data_dir)
        self.by_split = {
            split: [Task(**(r | {"folders": json.loads(r["folders"])})) for r in pq.read_table(data_dir / f"{split}.parquet").to_pylist()]
            for split in self.splits
        }  # fmt: skip

    def tasks(self, split: str) -> list[Task]:
        return self.by_split[split]

    def env(self, task: Task) -> FileCountEnv:
        return FileCountEnv(task.folders, task.root, task.kind)

    def expert(self) -> FileCountExpert:
        return FileCountExpert()

    def demonstrator(self, ws: Any) -> FileCountExpert:
        """The warm start's expert: warmstart.root_inline_rate of its recursive roots walk inline."""
        return FileCountExpert(ws.root_inline_rate)

    def demonstration_tasks(self, ws: Any, mode: str, n: int, rng: random.Random) -> list[Task]:
        """Fresh trees (never a val seed), easy to hard alike."""
        return [make_task(rng.randrange(VAL_SEED_BASE), rng.choice(list(DEPTHS)), "train") for _ in range(n)]
