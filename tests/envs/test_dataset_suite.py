"""A dataset is a suite: rows of a Parquet file or a `datasets` folder, a verifier function (sync or
async) or the judge, and no class written by the user."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rao_core.agent.runner import run_trees
from rao_core.config import ConfigError
from rao_core.envs.suites import open_suite
from rao_core.run import Run, load_config
from rao_core.sampler import draw_trees
from rao_core.stages.rollout import training_draw
from rao_core.verdicts import ScriptedJudge
from tests.agent.test_runtime import CHAT
from tests.conftest import CellScript

VERIFIERS = """
import asyncio

def exact(answer, task):
    return float(answer.strip() == str(task["answer"]))

async def exact_async(answer, task):
    await asyncio.sleep(0)
    return float(answer.strip() == str(task["answer"]))

def too_big(answer, task):
    return 2.0
"""


@pytest.fixture
def data(tmp_path, monkeypatch):
    data_rows(tmp_path)
    (tmp_path / "myverify.py").write_text(VERIFIERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def data_rows(tmp_path) -> None:
    """Twelve counting questions, half with a `context` holding the text, with difficulties and no
    split column (the suite holds out a seeded share): tmp_path/q.parquet."""
    rows = []
    for i in range(12):
        text = "ab" * (i + 1)
        row = {"id": f"q{i}", "goal": f"How many characters? {'' if i % 2 else text}", "answer": len(text),
               "difficulty": "short" if i < 6 else "long", "context": text if i % 2 else None}  # fmt: skip
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "q.parquet")


def config(tmp_path, *extra: str):
    return load_config(
        overrides=[f"runs_dir={tmp_path}", "suite=dataset", f"suite_args.path={tmp_path / 'q.parquet'}",
                   "suite_args.val_fraction=0.3", *extra]
    )  # fmt: skip


def answer_script(node) -> str:
    """Counts `context` when the task has one, else the text after the question mark."""
    if node.turn == 0:
        return "x = context if 'context' in dir() else GOAL.split('? ')[1]\nprint(len(x))"
    return f"finish({node.last_observation.strip()!r})"


def run_roots(cfg, judge=None):
    suite = open_suite(cfg)
    specs = draw_trees(suite, training_draw(Run(cfg), 0))

    def script(node) -> str:  # the goal text, as the node's REPL would not know it
        code = answer_script(node)
        return code.replace("GOAL", repr(node.env.goal))

    runs = asyncio.run(run_trees(specs, CellScript(script), CHAT, cfg.agent, cfg.sandbox, judge=judge))
    return suite, [next(x for x in r.records if x.depth == 0) for r in runs]


@pytest.mark.parametrize("verifier", ["myverify:exact", "myverify:exact_async"])
def test_a_verifier_function_scores_the_roots(data, verifier):
    cfg = config(data, f"suite_args.verifier={verifier}", "rollout.num_tasks=4")
    assert set(cfg.rollout.difficulty) == {"short", "long"} and cfg.eval.split == "val"  # from the data
    suite, roots = run_roots(cfg)
    assert len(suite.tasks("train")) + len(suite.tasks("val")) == 12 and suite.tasks("val")
    assert roots and all(r.status == "finished" and r.success == 1.0 for r in roots), [
        r.transcript for r in roots
    ]
    assert any(json.loads(r.targets)["answer"] for r in roots)


def test_without_a_verifier_the_judge_scores_the_root_against_the_answer(data):
    cfg = config(data, "judge.kind=scripted", "rollout.num_tasks=4")
    _, roots = run_roots(cfg, judge=ScriptedJudge())
    assert roots and all(r.success_source == "judge" and r.success == 1.0 for r in roots)


def test_a_verifier_outside_zero_one_fails_the_node_not_the_run(data):
    cfg = config(data, "suite_args.verifier=myverify:too_big", "rollout.num_tasks=2")
    _, roots = run_roots(cfg)
    assert all(
        r.status == "infra_error" and "must be a finite number in [0, 1]" in r.finish_message for r in roots
    )


def test_a_datasets_folder_with_its_own_splits(data, tmp_path):
    from datasets import Dataset, DatasetDict

    rows = pq.read_table(data / "q.parquet").to_pylist()
    DatasetDict({"train": Dataset.from_list(rows[:8]), "test": Dataset.from_list(rows[8:])}).save_to_disk(
        str(tmp_path / "ds")
    )
    cfg = load_config(overrides=[f"runs_dir={tmp_path}", "suite=dataset", f"suite_args.path={tmp_path / 'ds'}",
                                 "suite_args.verifier=myverify:exact"])  # fmt: skip
    assert (cfg.rollout.split, cfg.eval.split) == ("train", "test")
    suite = open_suite(cfg)
    assert len(suite.tasks("train")) == 8 and len(suite.tasks("test")) == 4


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        ([{"id": "a", "goal": ""}], [], "suite_args.path: row 0 (id a): `goal` must be a non-empty string"),
        ([{"goal": "g"}], [], "suite_args.path: row 0: missing column `id`"),
        ([{"id": "a", "goal": "g"}, {"id": "a", "goal": "h"}], [], "row 1: id 'a' appears twice"),
        ([{"id": "a", "goal": "g", "answer": 1}], ["suite_args.verifier=myverify:nope"],
         "suite_args.verifier: 'myverify:nope': module myverify has no nope"),
        ([{"id": "a", "goal": "g", "answer": 1}], ["suite_args.verifier="],
         "suite_args.verifier: needed when judge.kind is none"),
    ],
)  # fmt: skip
def test_bad_data_is_one_line(data, rows, extra, message):
    pq.write_table(pa.Table.from_pylist(rows), data / "q.parquet")
    with pytest.raises(ConfigError) as e:
        config(data, "suite_args.verifier=myverify:exact", *extra)
    assert message in str(e.value) and "\n" not in str(e.value)
