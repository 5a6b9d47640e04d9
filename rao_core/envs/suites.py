"""Task suites behind one door: synthesize a run's data once, then load tasks, environments and
the suite's scripted expert from the run's data folder. The rollout and evaluation stages only
talk to this."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rao_core.agent.policy import Policy
from rao_core.config import RunConfig
from rao_core.envs.base import Environment


class TextCraftData:
    """TextCraft-Synth, reference profile: one world per run, the paper's tools."""

    files = ("world.json", "train.parquet", "val.parquet")

    @staticmethod
    def synthesize(cfg: RunConfig, out: Path) -> None:
        from rao_core.envs.textcraft import synthesize

        synthesize(cfg.world, cfg.tasks, out)

    def __init__(self, data_dir: Path) -> None:
        from rao_core.envs.textcraft import World

        self.dir = data_dir
        self.world = World.from_json((data_dir / "world.json").read_text())

    def tasks(self, split: str) -> list[Any]:
        from rao_core.envs.textcraft import load_tasks

        return load_tasks(self.dir / f"{split}.parquet")

    def env(self, task: Any) -> Environment:
        from rao_core.envs.textcraft import env_from_task

        return env_from_task(self.world, task)

    def expert(self, cfg: RunConfig) -> Policy:
        from rao_core.envs.textcraft.expert import TextCraftExpert

        return TextCraftExpert(
            self.world, cfg.policy.error_rate, cfg.policy.latency_s, reply_format=cfg.agent.reply_format
        )


class TextCraftSmallData:
    """TextCraft-Synth, small-model profile: a fresh tiny world per task, one-name actions."""

    files = ("train.parquet", "val.parquet")

    @staticmethod
    def synthesize(cfg: RunConfig, out: Path) -> None:
        from rao_core.envs.textcraft.small import make_small_tasks, write_small_tasks

        for split in ("train", "val"):
            tasks = make_small_tasks(cfg.tasks.small_tasks_per_difficulty, split, seed=cfg.tasks.seed)
            write_small_tasks(tasks, out / f"{split}.parquet")

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir

    def tasks(self, split: str) -> list[Any]:
        from rao_core.envs.textcraft.small import load_small_tasks

        return load_small_tasks(self.dir / f"{split}.parquet")

    def env(self, task: Any) -> Environment:
        from rao_core.envs.textcraft.small import env_from_small_task

        return env_from_small_task(task)

    def expert(self, cfg: RunConfig) -> Policy:
        from rao_core.envs.textcraft.small_expert import SmallExpert

        return SmallExpert(cfg.policy.error_rate, cfg.policy.latency_s)


class OolongData:
    """Oolong-style long-context aggregation: synthetic session transcripts by length bucket (val:
    the real oolong-real rows when oolong.real_path is set), the chunk-and-delegate expert."""

    files = ("train.parquet", "val.parquet")

    @staticmethod
    def synthesize(cfg: RunConfig, out: Path) -> None:
        from rao_core.envs.oolong import synthesize

        synthesize(cfg.oolong, out)

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir

    def tasks(self, split: str) -> list[Any]:
        from rao_core.envs.oolong import load_tasks

        return load_tasks(self.dir / f"{split}.parquet")

    def env(self, task: Any) -> Environment:
        from rao_core.envs.oolong import env_from_task

        return env_from_task(task)

    def expert(self, cfg: RunConfig) -> Policy:
        from rao_core.envs.oolong.expert import OolongExpert

        a = cfg.agent
        return OolongExpert(
            cfg.oolong.chunk_chars, a.max_children, a.max_steps, cfg.policy.error_rate, cfg.policy.latency_s,
            reply_format=a.reply_format,
        )  # fmt: skip


class DeepDiveData:
    """DeepDive-style deep search: a seeded knowledge graph as a local web (BM25 search), multi-hop
    questions by hops (or the real rows from deepdive.real_path), the hop-by-hop expert."""

    files = ("settings.json", "graph.json", "pages.parquet", "train.parquet", "val.parquet")

    @staticmethod
    def synthesize(cfg: RunConfig, out: Path) -> None:
        from rao_core.envs.deepdive import synthesize

        synthesize(cfg.deepdive, out)

    def __init__(self, data_dir: Path) -> None:
        from rao_core.envs.deepdive import open_world

        self.dir = data_dir
        self.world = open_world(data_dir)

    def tasks(self, split: str) -> list[Any]:
        from rao_core.envs.deepdive import load_tasks

        return load_tasks(self.dir / f"{split}.parquet")

    def env(self, task: Any) -> Environment:
        from rao_core.envs.deepdive import env_from_task

        return env_from_task(self.world, task)

    def expert(self, cfg: RunConfig) -> Policy:
        from rao_core.envs.deepdive.expert import DeepDiveExpert

        return DeepDiveExpert(
            self.world.graph, cfg.policy.error_rate, cfg.policy.latency_s, reply_format=cfg.agent.reply_format
        )


SUITES: dict[str, type] = {
    "textcraft": TextCraftData,
    "textcraft-small": TextCraftSmallData,
    "oolong": OolongData,
    "deepdive": DeepDiveData,
}


def data_dir(cfg: RunConfig) -> Path:
    return cfg.layout.data(cfg.suite)


def open_suite(cfg: RunConfig):
    """Synthesize the run's data if it is missing (atomically per file), then open it."""
    suite = SUITES[cfg.suite]
    out = data_dir(cfg)
    if not all((out / f).is_file() for f in suite.files):
        out.mkdir(parents=True, exist_ok=True)
        suite.synthesize(cfg, out)
    return suite(out)
