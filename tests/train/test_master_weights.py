"""A bf16 checkpoint learns: the trainer's float32 master weights and AdamW moments carry from round
to round, while the engines get a bf16 copy (rao_core/train/state.py)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from rao_core.checkpoints import STATE, master_dir, optimizer_file
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.run import Run
from rao_core.stages import report
from rao_core.stages.train import train
from rao_core.train.samples import read_rows
from rao_core.train.stage import train_round
from rao_core.train.trainer import TrainConfig, train_rows
from tests.train import one_thread, tiny_model  # noqa: F401 (autouse fixture)
from tests.train.test_stage import write_round

# The paper's learning rate: each AdamW step moves a weight by about 3e-6, below bf16's resolution
# for nearly every weight of the model.
# fp32 arithmetic (bf16=False): these tests are about where updates accumulate, not about autocast,
# which `train.bf16: null` would turn on for a bf16 checkpoint on a CPU with bf16 matrix units.
CFG = TrainConfig(lr=3e-6, max_tokens_per_microbatch=128, steps_per_round=4, bf16=False)
ROUNDS = 3


def bf16_checkpoint(path: Path) -> Path:
    """The tiny model saved as pretrained models ship: bf16."""
    tiny_model(seed=3).to(torch.bfloat16).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def scored_rounds(run: Path, n: int) -> None:
    for r in range(n):
        write_round(run, [1.0, 0.0, 1.0, 0.0], seed=r, round_=r)


def uninterrupted(v0: Path, run: Path, rounds: int, cfg: TrainConfig, work: Path) -> dict[str, torch.Tensor]:
    """`rounds` rounds on the same rows in one process: one float32 model, one AdamW state."""
    model = AutoModelForCausalLM.from_pretrained(v0, dtype=torch.float32, local_files_only=True)
    moments = None
    for r in range(rounds):
        model, metrics = train_rows(
            model, tiny_tokenizer(), read_rows(run, r), cfg, work, optimizer_state=moments
        )
        moments = metrics.pop("optimizer_state")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(saved: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for k in saved:
        torch.testing.assert_close(saved[k], expected[k], rtol=0, atol=1e-7, msg=lambda m, k=k: f"{k}: {m}")


def staged(tmp_path: Path, run: Path, v0: Path, cfg: TrainConfig, drop_master: bool = False) -> list[dict]:
    """The campaign's way: every round a fresh train_round from the previous round's checkpoint."""
    ckpts = [v0] + [tmp_path / f"{'old' if drop_master else 'v'}{r + 1}" for r in range(ROUNDS)]
    metrics = []
    for r in range(ROUNDS):
        metrics.append(train_round(run, r, ckpts[r], ckpts[r + 1], cfg, origin=v0))
        if drop_master:  # what the trainer did before: restart from the served (rounded) copy
            import shutil

            shutil.rmtree(ckpts[r + 1] / STATE / "master")
    return metrics


def test_updates_accumulate_in_master_weights_of_a_bf16_model(tmp_path):
    run, v0 = tmp_path / "run", bf16_checkpoint(tmp_path / "v0")
    scored_rounds(run, ROUNDS)
    metrics = staged(tmp_path, run, v0, CFG)

    v3 = tmp_path / f"v{ROUNDS}"
    assert AutoConfig.from_pretrained(v3).dtype == torch.bfloat16  # the engines get bf16, as shipped
    assert {t.dtype for t in load_file(v3 / "model.safetensors").values()} == {torch.bfloat16}
    master = load_file(master_dir(v3) / "model.safetensors")
    assert {t.dtype for t in master.values()} == {torch.float32}
    assert master_dir(tmp_path / "v1") is None and optimizer_file(tmp_path / "v1") is None  # latest only

    # the master is exactly 3 rounds of uninterrupted float32 training on the same rows
    expected = uninterrupted(v0, run, ROUNDS, CFG, tmp_path / "work")
    assert_same_weights(master, expected)

    # and the served copy follows it: the share of served weights that differ from v0 grows
    totals = [m["served_changed_total"] for m in metrics]
    assert totals[0] < totals[1] < totals[2], totals
    for m in metrics:
        assert m["served_dtype"] == "bfloat16" and 0 < m["update_rms_ratio"] < 1e-3

    # what the stage did before this fix: each round restarts from the rounded copy, and the
    # served weights hardly move past round 1 (the issue measured 2.4% -> 2.6%)
    old = staged(tmp_path, run, v0, CFG, drop_master=True)
    assert old[-1]["served_changed_total"] < totals[-1]
    rounded = load_file(tmp_path / f"old{ROUNDS}" / "model.safetensors")
    assert any(not torch.equal(rounded[k], expected[k].to(torch.bfloat16)) for k in rounded)


def test_the_probe_is_that_of_the_served_bf16_weights(tmp_path):
    """What an engine computes from the saved bf16 files (loaded in float32, buffers fresh) is what
    the trainer wrote into probe.json: the check that vLLM serves this version must hold."""
    from rao_core.engines.probe import probe_logprobs, read_probe

    run, v0 = tmp_path / "run", bf16_checkpoint(tmp_path / "v0")
    scored_rounds(run, 1)
    auto = dataclasses.replace(CFG, bf16=None)  # bf16 autocast where this CPU has bf16 matrix units
    metrics = train_round(run, 0, v0, tmp_path / "v1", auto, origin=v0)
    print(f"trained with bf16 autocast: {metrics['bf16']}")
    written = read_probe(tmp_path / "v1")
    served = AutoModelForCausalLM.from_pretrained(tmp_path / "v1", dtype=torch.float32).eval()
    assert probe_logprobs(served, written["token_ids"]) == pytest.approx(written["logprobs"], abs=1e-5)


def test_a_round_that_changes_no_served_weight_says_so(tmp_path):
    from rao_core.run import load_config

    run, v0 = tmp_path / "runs" / "r", bf16_checkpoint(tmp_path / "v0")
    scored_rounds(run, 1)
    cfg = load_config(overrides=[f"runs_dir={tmp_path / 'runs'}", "run_name=r", f"policy.model={v0}"])
    still = dataclasses.replace(cfg, train=dataclasses.replace(CFG, lr=0.0))  # lr 0 moves nothing
    metrics = train(Run(still), 0)
    assert metrics["served_changed"] == 0 and "no served weight changed" in metrics["warning"]
    line = report.train_line(Run(still), 0)
    assert "served weights changed 0.0%" in line and "\nWARNING: round 0: no served weight changed" in line


def test_resume_after_a_kill_restores_master_and_moments(tmp_path):
    """Round 1 is killed while its checkpoint is being published; run again, it resumes from round
    0's master weights and moments, not from the bf16 copy, and ends where uninterrupted training does."""
    run, v0 = tmp_path / "run", bf16_checkpoint(tmp_path / "v0")
    scored_rounds(run, 2)
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    train_round(run, 0, v0, v1, CFG, origin=v0)
    killed = (
        "import os, signal, sys\n"
        "import rao_core.train.stage as stage\n"
        "stage.checkpoints.publish = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "stage.main(sys.argv[1:])\n"
    )
    args = ["--run-dir", str(run), "--round", "1", "--model", str(v1), "--out", str(v2), "--origin", str(v0)]
    args += [f"--set=train.{k}={v}" for k, v in (("lr", CFG.lr), ("max_tokens_per_microbatch", 128))]
    args += ["--set=train.steps_per_round=4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", killed, *args], capture_output=True, text=True, env=env)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert not v2.exists() and list(tmp_path.glob(".tmp-v2-*"))  # half a checkpoint, never published
    assert master_dir(v1) is not None and optimizer_file(v1) is not None  # round 0's state is intact

    resumed = train_round(run, 1, v1, v2, CFG, origin=v0)
    assert resumed["resumed_optimizer"] and not list(tmp_path.glob(".tmp-v2-*"))
    expected = uninterrupted(v0, run, 2, CFG, tmp_path / "work")
    assert_same_weights(load_file(master_dir(v2) / "model.safetensors"), expected)
    moments = torch.load(optimizer_file(v2), weights_only=True)
    assert {s["step"].item() for s in moments["state"].values()} == {8.0}  # 2 rounds x 4 steps


def test_a_float32_model_needs_no_master(tmp_path):
    run, v0 = tmp_path / "run", tmp_path / "v0"
    tiny_model(seed=3).save_pretrained(v0)
    tiny_tokenizer().save_pretrained(v0)
    scored_rounds(run, 1)
    m = train_round(run, 0, v0, tmp_path / "v1", CFG, origin=v0)
    assert master_dir(tmp_path / "v1") is None and m["served_dtype"] == "float32"
    assert 0 < m["served_changed"] == m["served_changed_total"]
