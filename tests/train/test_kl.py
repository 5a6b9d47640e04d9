"""train.beta > 0 through the training stage: the KL term's reference is policy version 0, a user's
bf16 checkpoint (full fine-tuning: its float32 copy) or the LoRA base with the adapter off.

The loss and gradient of the term are checked against the plain-PyTorch reference in test_loss.py;
here the question is which model is pi_ref, round after round."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from rao_core.checkpoints import master_dir
from rao_core.train.samples import read_rows
from rao_core.train.stage import train_round
from rao_core.train.trainer import TrainConfig
from tests.train import one_thread, reference_kl  # noqa: F401 (autouse fixture)
from tests.train.test_master_weights import bf16_checkpoint, scored_rounds

# one step a round: the KL is measured at the round's input weights, before the update
FULL = TrainConfig(lr=1e-2, max_tokens_per_microbatch=128, steps_per_round=1, beta=0.1)
LORA = dataclasses.replace(FULL, lora=True, lora_r=4, lora_alpha=8)


def float32(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()


def test_full_fine_tuning_measures_kl_to_version_0(tmp_path):
    run, v0 = tmp_path / "run", bf16_checkpoint(tmp_path / "v0")
    scored_rounds(run, 2)
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    m1 = train_round(run, 0, v0, v1, FULL, origin=v0)
    # round 0 trains version 0 itself: no distance yet
    assert m1["kl_to_reference"] == pytest.approx(0.0, abs=1e-7)
    # round 1 trains v1's float32 master; pi_ref is v0 (bf16 upcast), not v1 (the round's input)
    expected = reference_kl(float32(master_dir(v1)), float32(v0), read_rows(run, 1))
    assert expected > 1e-4
    m2 = train_round(run, 1, v1, v2, FULL, origin=v0)
    assert m2["kl_to_reference"] == pytest.approx(expected, rel=1e-3)


def test_lora_measures_kl_to_the_base(tmp_path):
    run, v0 = tmp_path / "run", bf16_checkpoint(tmp_path / "v0")
    scored_rounds(run, 2)
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    m1 = train_round(run, 0, v0, v1, LORA, origin=v0)
    m2 = train_round(run, 1, v1, v2, LORA, origin=v0)
    assert m1["kl_to_reference"] == pytest.approx(0.0, abs=1e-7)  # a fresh adapter is the base
    base = AutoModelForCausalLM.from_pretrained(v0, dtype=torch.bfloat16, local_files_only=True)
    policy = PeftModel.from_pretrained(base, v1).eval()
    with torch.autocast("cpu", enabled=False):
        with policy.disable_adapter():
            ref_kl_zero = reference_kl(policy, policy, read_rows(run, 1))
        assert ref_kl_zero == 0.0
    expected = reference_kl(policy, float32(v0).to(torch.bfloat16), read_rows(run, 1))
    assert expected > 1e-4
    assert m2["kl_to_reference"] == pytest.approx(expected, rel=2e-2)  # bf16 base: bf16 tolerance


def test_kl_without_version_0_is_a_clear_error(tmp_path):
    run, v0 = tmp_path / "run", bf16_checkpoint(tmp_path / "v0")
    scored_rounds(run, 1)
    with pytest.raises(ValueError, match="needs policy version 0"):
        train_round(run, 0, v0, tmp_path / "v1", FULL)
    assert not (tmp_path / "v1").exists()
