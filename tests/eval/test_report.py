"""The comparison grid (single against recursive, per context limit), the control arm's
configuration, and the reports: markdown tables checked cell by cell, plots decoded and checked
to be drawings, MLflow artifacts on SQLite."""

from __future__ import annotations

import os

import matplotlib.image
import pytest
from mlflow.tracking import MlflowClient

from rao_core.eval.report import comparison_markdown, curves_markdown, plot_learning_curves, plot_sft_loss
from rao_core.run import Run, control_config
from rao_core.stages import report
from rao_core.stages.evaluate import compare, evaluate, grid
from rao_core.tracking import Tracker
from tests.conftest import toy_config


def summary(success: float, trees: int, depth: int = 1) -> dict:
    from rao_core.eval.metrics import _summary

    wins = round(success * trees)
    return _summary(
        [
            {"success": float(i < wins), "nodes": 1 + depth, "max_depth": depth, "turns": 3, "tokens": 100,
             "seconds": 0.5, "delegated": depth > 0}
            for i in range(trees)
        ]
    )  # fmt: skip


def test_comparison_table_by_hand():
    def cell(mode, ctx, easy, hard):
        s = {"easy": summary(easy, 10, depth=int(mode == "recursive")), "hard": summary(hard, 10)}
        s["all"] = summary((easy + hard) / 2, 20)
        return {"mode": mode, "ctx": ctx, "summary": s}

    result = {"version": 2, "cells": [cell("single", 1024, 0.5, 0.0), cell("recursive", 1024, 0.9, 0.3)]}
    text = comparison_markdown(result, "t")
    lines = text.splitlines()
    assert lines[2] == "| difficulty | single @1024 | recursive @1024 |"
    # 5/10 has the Wilson interval [23.7%, 76.3%]; 0/10 -> [0%, 27.8%]
    assert lines[4] == "| easy | 50% [24–76] | 90% [60–98] |"
    assert lines[5] == "| hard | 0% [0–28] | 30% [11–60] |"
    assert lines[6].startswith("| all | 25% ") and "20 held-out trees per column" in text
    assert "| recursive @1024 | 3.0 | 2.00 | 1 | 100 | 0.50 |" in text


def test_curves_table_and_plot(tmp_path):
    arms = {
        "recursive": {0: {"easy": summary(0.5, 10)}, 1: {"easy": summary(0.8, 10)}},
        "single": {0: {"easy": summary(0.2, 10)}, 1: {"easy": summary(0.1, 10)}},
    }
    text = curves_markdown(arms)
    assert text.splitlines()[0] == "| version | recursive easy | single easy |"
    assert text.splitlines()[3].startswith("| v1 | 80% [")
    png = plot_learning_curves(arms, tmp_path / "curves.png")
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 500
    assert image[..., :3].std() > 0.05  # lines and text, not a blank canvas


def test_sft_loss_plot(tmp_path):
    """A warm start's log: loss rows of the SFT phase plotted, the drill's and summary rows skipped."""
    rows = [{"phase": "drill", "step": 1, "loss": 9.0}, {"phase": "sft", "step": 99, "train_runtime": 1.0}]
    rows += [{"phase": "sft", "step": 10 * i, "loss": 5.0 / (1 + i)} for i in range(1, 120)]
    png = plot_sft_loss({"a": rows, "b": rows[:40]}, tmp_path / "loss.png")
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 300 and image[..., :3].std() > 0.05


def test_grid_and_bad_settings(tmp_path):
    cfg = toy_config(tmp_path, "eval.modes=single,recursive", "eval.context_limits=4096,8192")
    assert grid(Run(cfg)) == [("single", 4096), ("recursive", 4096), ("single", 8192), ("recursive", 8192)]
    assert grid(Run(toy_config(tmp_path, "eval.modes=recursive"))) == [("recursive", 8192)]
    from rao_core.config import ConfigError

    with pytest.raises(ConfigError, match="eval.modes"):
        toy_config(tmp_path, "eval.modes=flat")
    with pytest.raises(ConfigError, match="eval.context_limits"):
        toy_config(tmp_path, "eval.context_limits=2048,lots")


def test_compare_version_runs_every_cell_once(tmp_path):
    cfg = toy_config(
        tmp_path, "eval.num_tasks=2", "eval.difficulty=easy", "eval.context_limits=1024,8192", "tracking.enabled=false"
    )  # fmt: skip
    result = compare(Run(cfg), 0)
    assert [(c["mode"], c["ctx"]) for c in result["cells"]] == grid(Run(cfg))
    for c in result["cells"]:
        assert c["summary"]["all"]["trees"] == 2
        if c["mode"] == "single":
            assert c["summary"]["all"]["max_depth"] == 0  # no launch_subagent
    recursive = {c["ctx"]: c["summary"] for c in result["cells"] if c["mode"] == "recursive"}
    assert recursive[8192]["all"]["max_depth"] >= 1  # the expert delegates
    stamp = os.stat(cfg.layout.compare(0, "single", 1024) / "nodes.parquet").st_mtime_ns
    assert compare(Run(cfg), 0) == result  # complete cells are read back, not re-run
    assert os.stat(cfg.layout.compare(0, "single", 1024) / "nodes.parquet").st_mtime_ns == stamp
    files = report.write_comparison(Run(cfg), result)
    assert "| easy |" in files["table"].read_text() and files["depth_plot"].stat().st_size > 5000


def test_control_arm_config(tmp_path):
    cfg = toy_config(tmp_path, "campaign.control_arm=true", "scoring.lam=0.4", "policy.model=warmstart")
    ctrl = control_config(cfg)
    assert ctrl.run_name == f"{cfg.run_name}-single" and ctrl.agent.mode == "single"
    assert ctrl.scoring.lam == 0.0 and ctrl.scoring.depth_weighting is False
    assert not ctrl.campaign.control_arm  # the control arm has no control arm
    assert ctrl.policy.model == str(cfg.run_dir / "checkpoints" / "warmstart" / "model")  # shared warm start
    same = ("agent.max_steps", "rollout.num_tasks", "rollout.group_size", "train.lr", "campaign.rounds")
    for name in same:
        section, field = name.split(".")
        assert getattr(getattr(ctrl, section), field) == getattr(getattr(cfg, section), field)
    more = control_config(toy_config(tmp_path, "campaign.control_tasks=7", "rollout.num_tasks=5"))
    assert (more.rollout.num_tasks, more.rollout.group_size) == (7, cfg.rollout.group_size)


def test_campaign_report_logs_both_arms(tmp_path):
    cfg = toy_config(tmp_path, "campaign.control_arm=true", "eval.num_tasks=1", "eval.difficulty=easy")
    for arm in (cfg, control_config(cfg)):
        for version in (0, 1):
            evaluate(Run(arm), version)
    reports = cfg.run_dir / "reports"
    reports.mkdir()
    killed = reports / ".tmp-delegation.png-0badf00d"  # a writer SIGKILLed mid-plot left it
    others = reports / ".tmp-compare-v1.md-0badf00d"  # another command's, maybe still writing
    killed.write_bytes(b"half a png"), others.write_text("half a table")
    files = report.write_campaign_report(Run(cfg))
    assert not killed.exists() and others.exists()
    text = files["curves"].read_text()
    assert "recursive easy" in text and "single easy" in text and "| v1 |" in text
    assert "| recursive v0 -> v1 | all | 1 |" in text and "| single v0 -> v1 | all | 1 |" in text
    assert "| recursive | 0 | 0 |" in text  # no rollouts yet: nothing spent
    lines = report.gain_lines(Run(cfg))
    assert [line.split()[0] for line in lines] == [cfg.run_name, f"{cfg.run_name}-single"]
    client = MlflowClient(Tracker.of(cfg).uri)
    names = {a.path for a in client.list_artifacts(Tracker.of(cfg).campaign_run_id(), "reports")}
    assert names == {f"reports/{p.name}" for p in files.values()}
    metrics = client.get_run(Tracker.of(cfg).campaign_run_id()).data.metrics
    for arm in ("recursive", "single"):
        assert (
            metrics[f"gain/{arm}/all_ci_low"]
            <= metrics[f"gain/{arm}/all"]
            <= metrics[f"gain/{arm}/all_ci_high"]
        )
