"""One source of truth for the sampling temperature: each node records the temperature it was
sampled at, and the trainer takes its log-probs at that value, so importance ratios compare like
with like whatever `policy.temperature` is."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from rao_core.run import Run, load_config
from rao_core.scoring import score_round
from rao_core.stages.rollout import roll_out
from rao_core.stages.train import train
from rao_core.train.samples import logprob_temperature, make_row

SMALL = [  # the shipped warm start on the small profile, a few short trees
    "rollout.num_tasks=2", "rollout.group_size=3", "rollout.difficulty=medium", "agent.max_steps=6",
    "scoring.zero_advantage_groups=keep", "scoring.single_tree_groups=zero_baseline",
    "train.lr=0", "train.steps_per_round=1", "train.keep_optimizer_state=false",
    "policy.engine_processes=0",  # the engine here: its child processes sample the same (test_hf_process)
]  # fmt: skip


@pytest.mark.parametrize("temperature", [0.7, 1.6])
def test_trainer_log_probs_are_taken_at_the_recorded_temperature(tmp_path, temperature):
    cfg = load_config(overrides=[f"runs_dir={tmp_path}", *SMALL, f"policy.temperature={temperature}"])
    path = roll_out(Run(cfg), 0)
    temps = set(pq.read_table(path / "nodes.parquet", columns=["temperature"]).column(0).to_pylist())
    assert len(temps) == 1 and temps.pop() == pytest.approx(temperature)
    score_round(cfg.run_dir, 0, cfg.scoring)
    metrics = train(Run(cfg), 0)
    # lr 0, one step: the trainer's log-probs are the sampler's up to float noise, ratio 1.
    # Taken at T = 1 instead (the old train.temperature default) they are off by whole nats.
    assert metrics["temperature"] == pytest.approx(temperature)
    assert metrics["action_tokens"] > 50
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=2e-3)
    assert metrics["logprob_diff_mean"] < 1e-4 and metrics["logprob_diff_max"] < 1e-2


def test_the_round_has_one_temperature():
    row = lambda t, lp=True: make_row("n", [1, 2, 3], [0, 1, 1], [0, -1, -1] if lp else None, 1.0, t)  # noqa: E731
    assert logprob_temperature([row(0.7), row(0.7)]) == pytest.approx(0.7)
    assert logprob_temperature([row(0.0)]) == 1.0  # greedy rows carry log-probs at T = 1
    assert logprob_temperature([row(None)]) == 1.0  # rows written before the column existed
    assert logprob_temperature([row(0.7), row(1.3, lp=False)]) == pytest.approx(0.7)  # scripted: no ratio
    with pytest.raises(ValueError, match="several temperatures"):
        logprob_temperature([row(0.7), row(1.0)])
    assert np.isclose(row(0.5).temperature, 0.5)
