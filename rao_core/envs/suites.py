"""The built-in task suites, and `open_suite`, the one door every stage uses: the suite a run
names (built-in or a user's, rao_core/envs/registry.py) synthesizes the run's data once, then
serves tasks, environments and its scripted expert from the run's data folder."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rao_core.config import RunConfig
from rao_core.envs.args import DeepDiveArgs, OolongArgs, SmallArgs, TextCraftArgs
from rao_core.envs.base import SUITE_SPECIFIC, Environment, Suite, SuiteContext
from rao_core.envs.registry import check_suite, labels_used, suite_args, suite_class
from rao_core.policy import Policy

# TextCraft-Synth's small profile is the embedded default (the defaults in rao_core/config). The
# other suites need an instruction-following LLM; their profile is the paper's reference agent with
# the scripted expert as the policy (a model is a `policy.kind`/`policy.model` away), plus each
# suite's paper setup. A value the user sets always wins.
REFERENCE_PROFILE: dict[str, dict] = {
    "agent": {
        "reply_format": "thought_python",
        "max_context_tokens": 8192,
        "max_new_tokens": 512,
        "max_steps": 25,
    },
    "policy": {"kind": "scripted", "model": "tiny"},
    "rollout": {"difficulty": "medium", "num_tasks": 8, "group_size": 4},
    "eval": {"difficulty": "easy,medium,hard"},
    "train": {"lr": 3e-6, "steps_per_round": 1},
}


class TextCraftData(Suite):
    """TextCraft-Synth, reference profile: one world per run, the paper's tools."""

    Args = TextCraftArgs
    files = ("world.json", "train.parquet", "val.parquet")
    profile = (REFERENCE_PROFILE,)
    reads = frozenset({"policy.error_rate"})

    def synthesize(self, out: Path) -> None:
        from rao_core.envs.textcraft import synthesize

        synthesize(self.args, self.ctx.task_seed, out)

    def open(self, data_dir: Path) -> None:
        from rao_core.envs.textcraft import World

        self.dir = data_dir
        self.world = World.from_json((data_dir / "world.json").read_text())

    def tasks(self, split: str) -> list[Any]:
        from rao_core.envs.textcraft import load_tasks

        return load_tasks(self.dir / f"{split}.parquet")

    def env(self, task: Any) -> Environment:
        from rao_core.envs.textcraft import env_from_task

        return env_from_task(self.world, task)

    def expert(self) -> Policy:
        from rao_core.envs.textcraft.expert import TextCraftExpert

        ctx = self.ctx
        return TextCraftExpert(
            self.world, ctx.policy.error_rate, ctx.policy.latency_s, reply_format=ctx.agent.reply_format
        )


class TextCraftSmallData(Suite):
    """TextCraft-Synth, small-model profile: a fresh tiny world per task, one-name actions."""

    Args = SmallArgs
    reads = frozenset(SUITE_SPECIFIC) - {"warmstart.demonstrator"}
    # the main job's draws (the configuration's defaults), not every difficulty the suite declares
    profile = ({"rollout": {"difficulty": ["hard"]}, "eval": {"difficulty": ["medium", "hard"]}},)

    def synthesize(self, out: Path) -> None:
        from rao_core.envs.textcraft.small import make_small_tasks, write_small_tasks

        for split in ("train", "val"):
            tasks = make_small_tasks(self.args.tasks_per_difficulty, split, seed=self.ctx.task_seed)
            write_small_tasks(tasks, out / f"{split}.parquet")

    def tasks(self, split: str) -> list[Any]:
        from rao_core.envs.textcraft.small import load_small_tasks

        return load_small_tasks(self.dir / f"{split}.parquet")

    def env(self, task: Any) -> Environment:
        from rao_core.envs.textcraft.small import env_from_small_task

        return env_from_small_task(task)

    def expert(self) -> Policy:
        from rao_core.envs.textcraft.small_expert import SmallExpert

        ctx = self.ctx
        return SmallExpert(ctx.policy.error_rate, ctx.policy.latency_s)

    # The warm start samples a fresh world per tree at the tiers warmstart.*_tiers name, and an
    # expert with the warm start's slip, give-up and inline-root rates (docs/small-profile.md).
    def demonstrator(self, ws: Any) -> Policy:
        from rao_core.envs.textcraft.small_expert import SmallExpert

        return SmallExpert(
            error_rate=ws.error_rate, give_up_rate=ws.give_up_rate, root_inline_rate=ws.root_inline_rate
        )

    def demonstration_tasks(self, ws: Any, mode: str, n: int, rng: random.Random) -> list[Any]:
        from rao_core.envs.textcraft.small import make_small_task, train_seed

        tiers = ws.recursive_tiers if mode == "recursive" else ws.flat_tiers
        return [make_small_task(train_seed(rng), rng.choice(tiers), "train") for _ in range(n)]

    def held_out_tasks(self, difficulties: tuple[str, ...], n: int, seed: int) -> list[Any]:
        from rao_core.envs.textcraft.small import make_small_tasks

        return make_small_tasks(n, "val", tuple(difficulties), seed=seed)


class OolongData(Suite):
    """Oolong-style long-context aggregation: synthetic session transcripts by length bucket (val:
    the real oolong-real rows when suite_args.real_path is set), the chunk-and-delegate expert."""

    Args = OolongArgs
    profile = (REFERENCE_PROFILE, {"scoring": {"lam": 0.4}, "agent": {"max_depth": 2}})
    reads = frozenset({"policy.error_rate"})

    def synthesize(self, out: Path) -> None:
        from rao_core.envs.oolong import synthesize

        synthesize(self.args, out)

    def tasks(self, split: str) -> list[Any]:
        from rao_core.envs.oolong import load_tasks

        return load_tasks(self.dir / f"{split}.parquet")

    def env(self, task: Any) -> Environment:
        from rao_core.envs.oolong import env_from_task

        return env_from_task(task)

    def expert(self) -> Policy:
        from rao_core.envs.oolong.expert import OolongExpert

        ctx = self.ctx
        a = ctx.agent
        return OolongExpert(
            self.args.chunk_chars, a.max_children, a.max_steps, ctx.policy.error_rate, ctx.policy.latency_s,
            reply_format=a.reply_format,
        )  # fmt: skip


class DeepDiveData(Suite):
    """DeepDive-style deep search: a seeded knowledge graph as a local web (BM25 search), multi-hop
    questions by hops (or the real rows from suite_args.real_path), the hop-by-hop expert."""

    Args = DeepDiveArgs
    files = ("settings.json", "graph.json", "pages.parquet", "train.parquet", "val.parquet")
    profile = (REFERENCE_PROFILE, {"agent": {"max_depth": 4}})
    reads = frozenset({"policy.error_rate"})

    def synthesize(self, out: Path) -> None:
        from rao_core.envs.deepdive import synthesize

        synthesize(self.args, out)

    def open(self, data_dir: Path) -> None:
        from rao_core.envs.deepdive import open_world

        self.dir = data_dir
        self.world = open_world(data_dir)

    def tasks(self, split: str) -> list[Any]:
        from rao_core.envs.deepdive import load_tasks

        return load_tasks(self.dir / f"{split}.parquet")

    def env(self, task: Any) -> Environment:
        from rao_core.envs.deepdive import env_from_task

        return env_from_task(self.world, task)

    def expert(self) -> Policy:
        from rao_core.envs.deepdive.expert import DeepDiveExpert

        ctx = self.ctx
        return DeepDiveExpert(
            self.world.graph, ctx.policy.error_rate, ctx.policy.latency_s, reply_format=ctx.agent.reply_format
        )


def make_suite(cfg: RunConfig) -> Suite:
    """The configured suite, its arguments validated and the labels the run uses checked
    (SuiteError, one line)."""
    cls = suite_class(cfg.suite)
    args = suite_args(cls, cfg.suite_args)
    ctx = SuiteContext.of(cfg)
    check_suite(cls, args, ctx, labels_used(cfg.rollout, cfg.eval, cfg.warmstart))
    return cls(ctx, args)


def open_suite(cfg: RunConfig, data_dir: Path | None = None) -> Suite:
    """Synthesize the run's data if it is missing (atomically per file), then open it (from the
    run's data folder, or `data_dir`)."""
    suite = make_suite(cfg)
    out = data_dir or cfg.layout.data(cfg.suite)
    if not all((out / f).is_file() for f in suite.files):
        out.mkdir(parents=True, exist_ok=True)
        suite.synthesize(out)
    suite.open(out)
    return suite


def difficulty_order(suite: str, raw_args: dict[str, Any]) -> tuple[str, ...]:
    """Suite `suite`'s difficulty labels in its own order (for reports), with its `suite_args`."""
    cls = suite_class(suite)
    return cls.labels(suite_args(cls, raw_args))[1]
