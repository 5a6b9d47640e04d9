"""Data-parallel training: two CPU processes (gloo) train a scored round exactly as one process does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rao_core.checkpoints import is_complete
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.run import Run, load_config
from rao_core.stages.train import train
from rao_core.train.samples import microbatches, plan_steps, rank_batches
from rao_core.train.stage import train_round
from tests.train import one_thread, random_rows  # noqa: F401 (autouse fixture)
from tests.train.test_stage import checkpoint, write_round  # noqa: F401 (fixture)

DDP_CPU = Path(__file__).resolve().parents[2] / "configs" / "accelerate" / "ddp-cpu.yaml"
# 20 rows in 6 micro-batches, 2 steps of 3: each rank runs 2 per step, one of them a filler.
TRAIN = ["train.lr=0.001", "train.max_tokens_per_microbatch=128", "train.steps_per_round=2"]


@pytest.mark.slow
def test_two_processes_give_the_loss_and_weights_of_one(tmp_path, checkpoint, capfd):  # noqa: F811
    cfg = load_config(
        overrides=[
            f"runs_dir={tmp_path}",
            "run_name=run",
            f"policy.model={checkpoint}",
            f"train.accelerate_config={DDP_CPU}",
            *TRAIN,
        ]
    )
    write_round(cfg.run_dir, [1.0, 0.0, 1.0, 0.0])
    one = train_round(cfg.run_dir, 0, checkpoint, tmp_path / "one", cfg.train)  # in this process
    capfd.readouterr()
    two = train(Run(cfg), 0)  # the campaign's path: torchrun, 2 processes, as a subprocess
    err = capfd.readouterr().err

    assert (one["processes"], two["processes"]) == (1, 2)
    assert one["microbatches"] == two["microbatches"] == 6 and two["steps"] == 2 and two["grad_accum"] == 2
    assert two["action_tokens"] == one["action_tokens"] and two["tokens"] == one["tokens"]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
    assert two["step_losses"] == pytest.approx(one["step_losses"], rel=1e-6)
    # the global norm of each step's all-reduced gradient, before clipping: the same gradient
    assert two["grad_norms"] == pytest.approx(one["grad_norms"], rel=1e-5)
    assert two["mean_ratio"] == pytest.approx(one["mean_ratio"], rel=1e-6)

    out = cfg.layout.checkpoint(1)
    before = load_file(checkpoint / "model.safetensors")
    w1, w2 = load_file(tmp_path / "one" / "model.safetensors"), load_file(out / "model.safetensors")
    assert w1.keys() == w2.keys() == before.keys()
    for k in w1:  # two AdamW steps at lr 1e-3 move weights by ~2e-3; the two runs agree to float32 noise
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    assert max(float((w1[k] - before[k]).abs().max()) for k in w1) > 1e-3

    # written once, by rank 0, complete, nothing left behind
    assert err.count("wrote checkpoint") == 1 and "rank 0 wrote checkpoint" in err
    assert is_complete(out) and (out / "tokenizer.json").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["version=1"]
    assert train(Run(cfg), 0) == two  # complete: returned without a launch


def test_rank_batches_deal_every_row_once_with_equal_counts():
    rows = random_rows(11, seed=4)
    plan = plan_steps(rows, 90, steps=2, seed=0)
    assert [len(step) for step in plan] == [3, 3]  # on 2 ranks: 2 each per step, one of them a filler
    pad = tiny_tokenizer().pad_token_id
    single = microbatches(rows, plan, pad)
    for a, b in zip(rank_batches(rows, plan, pad), single, strict=True):  # one process: unchanged
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for world in (2, 3):
        shares = [rank_batches(rows, plan, pad, r, world) for r in range(world)]
        assert len({len(s) for s in shares}) == 1  # every rank runs as many micro-batches
        trained = sum(int((mb["completion_mask"] * mb["tool_mask"]).sum()) for s in shares for mb in s)
        assert trained == sum(r.action_tokens for r in rows)  # each action token once; fillers carry none
        fillers = [mb for s in shares for mb in s if not mb["tool_mask"].any()]
        assert len(fillers) == {2: 2, 3: 0}[world]
        assert all(not mb["advantages"].any() for mb in fillers)
