"""Resuming a run folder with another configuration: changes that would alter completed stages are
refused in one line, changes that only affect what has not run are recorded, and a new branch of
rounds shares the completed ones."""

from __future__ import annotations

import json

import pytest
import yaml

from rao_core import resume
from rao_core.config import ConfigError
from rao_core.run import Run
from rao_core.scoring import score_round
from rao_core.stages.rollout import roll_out
from rao_core.stages.synthesize import prepare
from rao_core.stages.train import train
from tests.conftest import toy_config


def completed_round(tmp_path, *overrides: str):
    """A run folder with round 0 rolled out and scored (scripted policy: seconds)."""
    cfg = toy_config(tmp_path, *overrides)
    prepare(Run(cfg))
    roll_out(Run(cfg), 0)
    score_round(cfg.run_dir, 0, cfg.scoring)
    return cfg


def test_a_change_that_alters_completed_stages_is_refused(tmp_path):
    completed_round(tmp_path)
    changed = toy_config(tmp_path, "scoring.lam=0.4", "rollout.num_tasks=3")
    with pytest.raises(ConfigError) as err:
        prepare(Run(changed))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("run_name:")
    assert "scoring.lam (0.0 -> 0.4)" in msg and "rollout.num_tasks (2 -> 3)" in msg and "--branch" in msg


def test_a_change_of_future_rounds_only_is_recorded(tmp_path):
    cfg = completed_round(tmp_path)
    more = toy_config(tmp_path, "campaign.rounds=20", "rollout.max_concurrent_trees=4")
    diff = prepare(Run(more))
    assert diff == {"campaign.rounds": (12, 20), "rollout.max_concurrent_trees": (96, 4)}
    (entry,) = resume.history(cfg.run_dir)
    assert entry["round"] == more.layout.completed_rounds() == 0
    assert entry["changes"]["campaign.rounds"] == [12, 20]
    assert resume.stored_config(cfg.run_dir)["campaign"]["rounds"] == 20
    assert prepare(Run(more)) == {}  # recorded once


@pytest.mark.parametrize("k", [0, 1])
def test_a_folder_from_before_the_auto_corrections_resumes_where_none_acts(tmp_path, k):
    """A run folder that stored train.trust_region null and kl_guard off (the defaults before
    `auto`): at k = 0 they never act, so today's defaults resume it; at k = 1 they would change
    the rounds to come, and the resume is refused with the keys."""
    cfg = completed_round(tmp_path, f"campaign.max_staleness={k}")
    stored = resume.stored_config(cfg.run_dir)
    stored["train"].update(trust_region=None, kl_guard="off")
    cfg.layout.config.write_text(yaml.safe_dump(stored))
    if k == 0:
        assert prepare(Run(cfg)) == {}
        return
    with pytest.raises(ConfigError) as err:
        prepare(Run(cfg))
    assert "train.trust_region (None -> 'auto'), train.kl_guard ('off' -> 'auto')" in str(err.value)


def test_switching_between_model_engines_is_free(tmp_path):
    cfg = toy_config(tmp_path, "policy.kind=hf")
    prepare(Run(cfg))
    (cfg.run_dir / "data").mkdir()  # a completed stage
    assert prepare(Run(toy_config(tmp_path, "policy.kind=vllm", "policy.vllm_python=/usr/bin/python3"))) == {
        "policy.kind": ("hf", "vllm")
    }  # vllm_python is a setting of the vllm engine only: nothing to compare
    with pytest.raises(ConfigError, match="policy.kind"):
        prepare(Run(toy_config(tmp_path, "policy.kind=scripted")))


def test_before_any_completed_stage_everything_may_change(tmp_path):
    cfg = toy_config(tmp_path)
    prepare(Run(cfg))  # a config was saved, nothing ran
    assert "scoring.lam" in prepare(Run(toy_config(tmp_path, "scoring.lam=0.4")))


def test_cli_refuses_before_any_work_and_check_reads_only(tmp_path, capsys):
    from flows.cli import main

    cfg = completed_round(tmp_path)
    before = sorted(p.relative_to(cfg.run_dir) for p in cfg.run_dir.rglob("*"))
    args = ["--set", f"runs_dir={tmp_path}", *[a for o in TOY_ARGS for a in ("--set", o)]]
    assert main(["train", "--check", *args, "--set", "scoring.lam=0.4"]) == 2
    assert "scoring.lam (0.0 -> 0.4)" in capsys.readouterr().err
    assert main(["train", "--check", *args, "--set", "campaign.rounds=3"]) == 0
    assert sorted(p.relative_to(cfg.run_dir) for p in cfg.run_dir.rglob("*")) == before


def test_branch_shares_completed_rounds_and_runs_on_with_new_settings(tmp_path):
    cfg = completed_round(
        tmp_path, "scoring.zero_advantage_groups=keep", "scoring.single_tree_groups=zero_baseline"
    )
    train(Run(cfg), 0)  # version 1: the round is complete
    branched = toy_config(
        tmp_path, "run_name=lam", "scoring.lam=0.4", "scoring.zero_advantage_groups=keep",
        "scoring.single_tree_groups=zero_baseline",
    )  # fmt: skip
    resume.branch(cfg, branched, from_round=1)
    for part in (
        "rollouts/round=0/nodes.parquet",
        "scores/round=0/scores.parquet",
        "checkpoints/version=1/config.json",
    ):
        a, b = cfg.run_dir / part, branched.run_dir / part
        assert b.is_file() and a.stat().st_ino == b.stat().st_ino  # shared by a hard link
    assert prepare(Run(branched)) == {}  # the branch holds its own settings now
    (entry,) = resume.history(branched.run_dir)
    assert entry["branch_of"] == str(cfg.run_dir) and entry["from_round"] == 1
    assert entry["changes"]["scoring.lam"] == [0.0, 0.4]
    with pytest.raises(ConfigError, match="exists already"):
        resume.branch(cfg, branched, from_round=1)
    with pytest.raises(ConfigError, match="round 1 .* is not complete"):
        resume.branch(cfg, toy_config(tmp_path, "run_name=far"), from_round=2)
    assert not (tmp_path / "far").exists()  # checked before anything was written


def test_history_lines_are_json(tmp_path):
    cfg = completed_round(tmp_path)
    prepare(Run(toy_config(tmp_path, "campaign.rounds=2")))
    lines = cfg.layout.history.read_text().splitlines()
    assert [json.loads(x)["changes"] for x in lines] == [{"campaign.rounds": [12, 2]}]


TOY_ARGS = [
    "suite=textcraft", "agent.reply_format=thought_python", "agent.max_context_tokens=8192",
    "agent.max_new_tokens=512", "agent.max_steps=25", "policy.kind=scripted", "policy.model=tiny",
    "policy.error_rate=0.1", "suite_args.domains=2", "suite_args.max_tier=6", "suite_args.items_per_tier=6",
    "suite_args.cross_domain_items=0", "suite_args.tasks_per_item=1", "rollout.difficulty=easy", "rollout.num_tasks=2",
    "rollout.group_size=2", "agent.cell_timeout_s=5", "agent.tree_timeout_s=60",
]  # fmt: skip
