"""A suite is a plugin: a user's suite, written outside rao_core, comes in by import path or by an
installed package's `rao.suites` entry point, through the same door as ours; its settings
(`suite_args`), labels and defaults are its own; mistakes are one line from `rao train --check`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rao_core.agent.runner import run_trees
from rao_core.config import ConfigError
from rao_core.envs.registry import registered, suite_class
from rao_core.envs.suites import TextCraftSmallData, open_suite
from rao_core.run import Run, load_config
from rao_core.sampler import draw_trees
from rao_core.stages.evaluate import evaluation_draw
from rao_core.stages.rollout import training_draw
from tests.agent.test_runtime import CHAT
from tests.conftest import CellScript

ROOT = Path(__file__).resolve().parents[2]

# A whole suite in one file, as a user would write it (it imports only rao_core's public interface).
USER_SUITE = """
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from rao_core.envs.base import Environment, Suite


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = Field(6, ge=1)
    word: str = "yes"


class EchoEnv(Environment):
    def __init__(self, goal, word):
        self.goal, self.word = goal, word

    def goal_text(self):
        return self.goal

    def targets(self):
        return {"word": self.word}

    def tools(self):
        return {"shout": lambda text: str(text).upper()}

    def tool_docs(self, recursive):
        return "shout(text) -> str"

    def fork(self, goal=None):
        return EchoEnv(str(goal), self.word)

    def success(self, finished, finish_message):
        return float(finished and finish_message == self.word.upper())


class Task:
    def __init__(self, row):
        self.task_id, self.split, self.difficulty = row["id"], row["split"], row["difficulty"]


class EchoSuite(Suite):
    splits = ("fit", "holdout")
    difficulties = ("small", "big")
    Args = Args
    profile = ({"rollout": {"split": "fit", "difficulty": ["small", "big"], "num_tasks": 2, "group_size": 2},
                "eval": {"split": "holdout", "difficulty": ["big"], "num_tasks": 1}},)
    files = ("tasks.parquet",)

    def synthesize(self, out: Path) -> None:
        rows = [{"id": f"t{i}", "split": self.splits[i % 2], "difficulty": self.difficulties[i // 2 % 2]}
                for i in range(self.args.n)]
        pq.write_table(pa.Table.from_pylist(rows), out / "tasks.parquet")

    def open(self, data_dir):
        super().open(data_dir)
        self.rows = [Task(r) for r in pq.read_table(data_dir / "tasks.parquet").to_pylist()]

    def tasks(self, split):
        return [t for t in self.rows if t.split == split]

    def env(self, task):
        return EchoEnv(f"say {self.args.word}", self.args.word)


class Half(Suite):
    def tasks(self, split):
        return []


class Bare(EchoSuite):
    Args = None
"""


def test_builtin_suites_come_through_the_entry_points():
    names = registered()
    assert {"textcraft", "textcraft-small", "oolong", "deepdive", "dataset"} <= set(names)
    assert suite_class("textcraft-small") is TextCraftSmallData


def test_a_user_suite_by_import_path_runs_its_trees(user_pkg, tmp_path):
    cfg = load_config(
        overrides=[f"runs_dir={tmp_path}", "suite=usertasks.echo:EchoSuite", "suite_args.word=hi"]
    )
    assert (cfg.rollout.split, cfg.rollout.difficulty, cfg.eval.split) == ("fit", ["small", "big"], "holdout")
    suite = open_suite(cfg)
    assert suite.args.word == "hi" and suite.args.n == 6
    specs = draw_trees(suite, training_draw(Run(cfg), 0))
    assert len(specs) == 4 and {s.difficulty for s in specs} <= {"small", "big"}
    script = CellScript(lambda n: "print(shout('hi'))" if n.turn == 0 else "finish(shout('hi'))")
    runs = asyncio.run(run_trees(specs, script, CHAT, cfg.agent, cfg.sandbox))
    assert [r.records[0].success for r in runs] == [1.0] * 4
    evals = draw_trees(suite, evaluation_draw(Run(cfg), 0))
    assert evals and all(s.task_id in {t.task_id for t in suite.tasks("holdout")} for s in evals)


def test_an_installed_package_registers_by_entry_point(user_pkg, tmp_path):
    """A distribution's metadata on sys.path, as `pip install` leaves it: the name resolves."""
    dist = user_pkg / "usertasks-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: usertasks\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rao.suites]\necho = usertasks.echo:EchoSuite\n")
    cfg = load_config(overrides=[f"runs_dir={tmp_path}", "suite=echo"])
    assert open_suite(cfg).tasks("fit")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["suite=usertasks.nope:EchoSuite"],
            "suite: 'usertasks.nope:EchoSuite': cannot import usertasks.nope",
        ),
        (["suite=usertasks.echo:Nope"], "suite: 'usertasks.echo:Nope': module usertasks.echo has no Nope"),
        (["suite=usertasks.echo:EchoEnv"], "is not a subclass of rao_core.envs.base.Suite"),
        (
            ["suite=usertasks.echo:Half"],
            "suite: 'usertasks.echo:Half': Half does not implement env, synthesize",
        ),
        (
            ["suite=usertasks.echo:EchoSuite", "suite_args.n=0"],
            "suite_args.n: 0: input should be greater than or equal to 1",
        ),
        (
            ["suite=usertasks.echo:EchoSuite", "suite_args.colour=red"],
            "suite_args.colour: not a setting of EchoSuite (it has: n, word)",
        ),
        (
            ["suite=usertasks.echo:EchoSuite", "rollout.difficulty=hard"],
            "rollout.difficulty: 'hard': not a difficulty of EchoSuite (it has: small, big)",
        ),
        (
            ["suite=usertasks.echo:EchoSuite", "eval.split=val"],
            "eval.split: 'val': not a split of EchoSuite (it has: fit, holdout)",
        ),
        (
            ["suite=usertasks.echo:Bare", "suite_args.n=1"],
            "suite_args: Bare takes no arguments (got n)",
        ),
        (
            ["suite=textcraft-small", "suite_args.n=1"],
            "suite_args.n: not a setting of TextCraftSmallData (it has: tasks_per_difficulty)",
        ),
        (["suite=textcraft-smal"], "suite: 'textcraft-smal': not a registered suite"),
    ],
)
def test_suite_mistakes_are_one_line(user_pkg, overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_rao_train_check_names_a_bad_suite_in_one_line(user_pkg, tmp_path):
    """From the command line, in the user's folder (a console script: the folder is on the path)."""
    rao = Path(sys.executable).parent / "rao"
    ok = subprocess.run([rao, "train", "--check", "--set", "suite=usertasks.echo:EchoSuite", "--set", f"runs_dir={tmp_path}"],
                        cwd=user_pkg, capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([rao, "train", "--check", "--set", "suite=usertasks.echo:EchoSuite", "--set", "suite_args.n=x"],
                         cwd=user_pkg, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode != 0
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith("suite_args.n: 'x': input should be a valid integer, unable to parse string as an integer")
    )


def test_builtin_profiles_come_from_the_suites():
    for name, depth in [("oolong", 2), ("deepdive", 4), ("textcraft", 6)]:
        cfg = load_config(overrides=[f"suite={name}"])
        assert cfg.agent.reply_format == "thought_python" and cfg.agent.max_depth == depth
    assert load_config(overrides=["suite=oolong", "agent.max_depth=3"]).agent.max_depth == 3  # the user wins


def test_no_suite_is_special_cased_in_the_config():
    """Suite names appear in rao_core/config only in help text: the profiles live with the suites."""
    for path in (ROOT / "rao_core" / "config").glob("*.py"):
        code = textwrap.dedent(path.read_text())
        assert "SUITE_DEFAULTS" not in code and '"oolong":' not in code, path


def test_a_profile_may_be_one_mapping_and_difficulties_default_to_the_declared_ones(user_pkg, tmp_path):
    """`profile = {...}` (the natural spelling) is one layer; a suite that sets no difficulty rolls
    out and evaluates every difficulty it declares; a profile of another shape is one line."""
    (user_pkg / "usertasks" / "plain.py").write_text(
        "from usertasks.echo import EchoSuite\n\n"
        "class Mapping(EchoSuite):\n"
        "    profile = {'agent': {'max_steps': 5}, 'rollout': {'split': 'fit'}, 'eval': {'split': 'holdout'}}\n\n"
        "class Wrong(EchoSuite):\n"
        "    profile = 'agent.max_steps=5'\n"
    )
    cfg = load_config(overrides=[f"runs_dir={tmp_path}", "suite=usertasks.plain:Mapping"])
    assert cfg.agent.max_steps == 5 and cfg.rollout.difficulty == cfg.eval.difficulty == ["small", "big"]
    assert load_config(overrides=["suite=textcraft-small"]).rollout.difficulty == ["hard"]  # the main job's
    with pytest.raises(ConfigError, match=r"^Wrong.profile: expected a mapping of settings .* got str$"):
        load_config(overrides=["suite=usertasks.plain:Wrong"])
