"""The small interface every task suite implements: a `Suite` makes a run's tasks and turns each
into an `Environment`, one per node.

The agent runtime knows nothing about crafting or search: it asks the environment which tools the
REPL exposes, how a child's environment is forked from its parent's, and whether a node succeeded.
Built-in and user suites come in through the same door (rao_core/envs/registry.py): an import
path (`suite: mypkg.tasks:MySuite`) or the `rao.suites` entry-point group. docs/own-task.md.
"""

from __future__ import annotations

import inspect
import math
import numbers
import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from rao_core.config import AgentConfig, JudgeConfig, PolicyConfig, RunConfig, SandboxConfig

# Settings read only by suites that say so (Suite.reads): a plugin suite's demonstrator may read any
# warmstart.* field, so a suite names the ones it uses; `--check` warns about the others.
SUITE_SPECIFIC = (
    "warmstart.recursive_tiers",
    "warmstart.flat_tiers",
    "warmstart.error_rate",
    "warmstart.give_up_rate",
    "warmstart.root_inline_rate",
    "policy.error_rate",
    "warmstart.demonstrator",
)


class LaunchError(ValueError):
    """Bad arguments to launch_subagent; the message is returned to the calling cell as a string."""


class ScorerError(ValueError):
    """A scorer broke the reward contract: it gave something other than a finite number in [0, 1],
    or raised. The message names the scorer."""


def success_value(value: Any, source: str) -> float:
    """The reward contract, the same on every route (a suite's success(), a dataset's verifier, a
    judge): s(X) is a finite number in [0, 1] (a bool counts as 0 or 1). Anything else raises,
    naming `source` and the value, and the runtime ends that node as an infrastructure failure:
    a broken scorer must not reach training as a reward."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        score = float(value)
        if math.isfinite(score) and 0.0 <= score <= 1.0:
            return score
    raise ScorerError(f"{source} returned {value!r}: a success must be a finite number in [0, 1]")


def scorer_name(env: Environment) -> str:
    """How an error names the environment's success(): its suite, else its class."""
    name = env.suite if env.suite != "base" else type(env).__qualname__
    return f"suite {name} ({type(env).__module__}.{type(env).__qualname__}.success)"


async def score(env: Environment, finished: bool, finish_message: str) -> float:
    """s(X) of a node from its environment's success() (awaited when async), under the reward
    contract; a scorer that raises or breaks it raises ScorerError naming it (the node's end, and
    `rao train --check`'s smoke test, score the same way)."""
    try:
        value = env.success(finished, finish_message)
        value = await value if inspect.isawaitable(value) else value
    except ScorerError:
        raise
    except Exception as e:
        raise ScorerError(f"{scorer_name(env)} raised {type(e).__name__}: {e}") from e
    return success_value(value, scorer_name(env))


class Environment(ABC):
    suite: str = "base"
    # The REPL name of the delegation primitive. Async (awaited, siblings can run concurrently) in
    # the reference profiles; a suite for tiny models may expose a short blocking call like `sub(x)`.
    launch_tool: str = "launch_subagent"
    launch_async: bool = True
    repl_echo: bool = False  # print a cell's trailing expression (short actions for tiny models)

    @abstractmethod
    def goal_text(self) -> str:
        """The task as the node sees it in its first user message."""

    @abstractmethod
    def targets(self) -> dict[str, Any]:
        """Structured targets (JSON-serialisable), stored with the node."""

    @abstractmethod
    def tools(self) -> dict[str, Callable[..., Any]]:
        """Tools callable from a cell with JSON arguments; they return JSON values. An `async def`
        tool is awaited on the event loop; a plain function runs in a worker thread (a bounded
        pool, sandbox.tool_threads), so a slow tool delays only the node that called it."""

    @abstractmethod
    def tool_docs(self, recursive: bool) -> str:
        """The action-space text of the system prompt (tool signatures and rules)."""

    @abstractmethod
    def fork(self, *args: Any, **kwargs: Any) -> Environment:
        """A child's environment from the arguments of `launch_subagent`; raises LaunchError."""

    # The forks of one tree share mutable state (TextCraft's inventory): their plain tools then take
    # turns, in the order the calls arrive, so a tree stays the same whatever the threads do.
    shared_state: bool = False

    @abstractmethod
    def success(self, finished: bool, finish_message: str) -> float | Awaitable[float]:
        """s(X) in [0, 1] for the node that owns this environment (may be `async def`)."""

    def judge_inputs(self, finished: bool, finish_message: str) -> dict[str, str] | None:
        """For a node with no exact verifier (a sub-agent in the Oolong or DeepDive suites): what a
        judge must see, {"goal": ..., "answer": ..., "reference": ... (optional)}. The runtime then
        takes s(X) from the judge's verdict (success_source "judge"). None (the default): success()
        is exact (success_source "verifier")."""
        return None

    def context_chars(self) -> int:
        """Size of any context data the node holds outside its prompt (Oolong's `context`)."""
        return 0

    def repl_variables(self) -> dict[str, Any]:
        """JSON values preset as variables in the node's REPL (for example `context`)."""
        return {}

    def reference_answer(self) -> str | None:
        """The finish message of a correct node, when the suite knows it (a dataset's `answer`):
        `rao train --check` expects success(True, reference_answer()) to be 1. None: unknown."""
        return None


def profile_layers(cls: type[Suite]) -> list[dict]:
    """A suite's `profile` as configuration layers: a mapping of settings, or a tuple of them."""
    profile = cls.profile
    layers = [profile] if isinstance(profile, dict) else profile
    if not isinstance(layers, tuple | list) or not all(isinstance(x, dict) for x in layers):
        raise ValueError(
            f"{cls.__name__}.profile: expected a mapping of settings such as {{'agent': {{'max_steps': 8}}}} "
            f"(or a tuple of them), got {type(profile).__name__}"
        )
    return list(layers)


def select_tasks(tasks: list, split: str, difficulties: list[str], n: int, seed: int) -> list:
    """A seeded sample of n tasks of one split and the given difficulties (all of them if n >= pool);
    any suite's tasks, each with `.split` and `.difficulty`."""
    pool = [t for t in tasks if t.split == split and t.difficulty in difficulties]
    if n >= len(pool):
        return pool
    return random.Random(seed).sample(pool, n)


class Task(Protocol):
    """What the runtime reads of a suite's task; the suite keeps whatever else it needs on it."""

    task_id: str
    split: str
    difficulty: str


@dataclass(frozen=True)
class SuiteContext:
    """What a suite sees of the run, never the whole configuration: its name, the agent's budgets
    and sandbox (its expert plans within them), the policy section (the scripted expert's
    error_rate and latency_s), the judge section (is there a judge to score what it cannot), the
    training and held-out splits, and the run's task seed (tasks.seed: a suite that synthesizes
    may seed its data with it). Its own settings are its `args` (suite_args)."""

    suite: str
    agent: AgentConfig
    sandbox: SandboxConfig
    policy: PolicyConfig
    judge: JudgeConfig
    train_split: str = "train"
    eval_split: str = "val"
    task_seed: int = 0

    @classmethod
    def of(cls, cfg: RunConfig) -> SuiteContext:
        return cls(cfg.suite, cfg.agent, cfg.sandbox, cfg.policy, cfg.judge, cfg.rollout.split, cfg.eval.split,
                   cfg.tasks.seed)  # fmt: skip


class Suite(ABC):
    """A task suite: synthesizes (or reads) a run's tasks once into its data folder, then makes
    each task's root Environment. The runtime builds it as `Suite(ctx, args)` (a SuiteContext and
    the validated `suite_args`), calls `synthesize` when one of `files` is missing from the data
    folder, then `open`."""

    # The data files `synthesize` writes: all present means the run's data is complete.
    files: ClassVar[tuple[str, ...]] = ("train.parquet", "val.parquet")
    # Labels the suite declares: rollout.split / eval.split and the difficulty lists must use them;
    # reports and SQL take them as they are (easy..extreme first, then other labels by name).
    splits: ClassVar[tuple[str, ...]] = ("train", "val")
    difficulties: ClassVar[tuple[str, ...]] = ("easy", "medium", "hard", "extreme")
    # The model of `suite_args` (pydantic; forbid extra keys); None: the suite takes no arguments.
    Args: ClassVar[type[BaseModel] | None] = None
    # Configuration defaults of the suite (a YAML-shaped mapping, or a tuple of them), applied over
    # "every declared difficulty" and under the user's YAML and --set: the agent profile and the
    # settings a suite is meant to run with.
    profile: ClassVar[dict | tuple[dict, ...]] = ()
    # Which of the suite-specific settings its expert and demonstrator read (envs/checks.py:
    # SUITE_SPECIFIC, e.g. "warmstart.root_inline_rate"); `--check` warns about the others.
    reads: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, ctx: SuiteContext, args: Any = None) -> None:
        self.ctx, self.args = ctx, args
        self.dir = Path()

    @classmethod
    def reads_demonstrator(cls) -> bool:
        """Does the suite learn from a demonstrator function of the user's (warmstart.demonstrator,
        as the dataset suite does) rather than only from an expert of its own?"""
        return "warmstart.demonstrator" in cls.reads

    @classmethod
    def labels(cls, args: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(splits, difficulties) this suite can serve with these arguments (a dataset's come from
        its rows)."""
        return cls.splits, cls.difficulties

    @classmethod
    def defaults(cls, args: Any) -> list[dict]:
        """The configuration layers of this suite with these arguments: roll out and evaluate every
        difficulty it declares, then its `profile` (one mapping, or a tuple of them)."""
        difficulties = list(cls.labels(args)[1])
        every = {"rollout": {"difficulty": difficulties}, "eval": {"difficulty": difficulties}}
        return [every, *profile_layers(cls)]

    @classmethod
    def check(cls, ctx: SuiteContext, args: Any) -> None:
        """Rules between the suite's arguments and what it sees of the run, checked at load (`rao
        train --check`); raise ValueError with one line naming the key."""
        return None

    @abstractmethod
    def synthesize(self, out: Path) -> None:
        """Write `files` into `out` (each atomically: rao_core/store/files.py)."""

    def open(self, data_dir: Path) -> None:
        """Read what `synthesize` wrote (called once, before `tasks` and `env`)."""
        self.dir = data_dir

    @abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """Every task of one split."""

    @abstractmethod
    def env(self, task: Any) -> Environment:
        """The root environment of a task (a fresh one per tree)."""

    def expert(self) -> Any:
        """A scripted expert policy (rao_core/policy.py) for `policy.kind=scripted` and the
        warm start's demonstrations; None when the suite has none."""
        return None

    # -- the warm start (rao_core/train/warmstart.py); the defaults suit most suites ---------------
    def demonstrator(self, ws: Any) -> Any:
        """The policy whose trees the warm start learns from (warmstart.* settings `ws`): the
        expert. It may record its deliberate slips as `mistakes` (node id -> turns), kept out of
        the loss."""
        return self.expert()

    def demonstration_tasks(self, ws: Any, mode: str, n: int, rng: random.Random) -> list[Task]:
        """n training tasks for the warm start's expert trees of one shape (recursive or flat)."""
        pool = self.tasks(self.ctx.train_split)
        return [rng.choice(pool) for _ in range(n)] if pool else []

    def held_out_tasks(self, difficulties: tuple[str, ...], n: int, seed: int) -> list[Task]:
        """n held-out tasks (eval.split) per difficulty, seeded, for the warm start's evaluation."""
        split = self.ctx.eval_split
        pool = self.tasks(split)
        return [t for d in difficulties for t in select_tasks(pool, split, [d], n, seed)]
