"""The real tier: SmolLM2-135M-Instruct, a pretrained chat model that installs from the registry
(`make smollm2`), through everything a user's own model goes through (docs/real-model.md). This
file: the .gguf conversion, and bf16 sampling against the trainer's and float32's log-probs. The
engine rounds are in test_engines_hf.py and test_engines_vllm.py, the memory plan in
test_memory_plan.py; the converted model and the warm-started agent are shared (conftest.py)."""

from __future__ import annotations

import json

import pytest
import torch

from rao_core.models.locate import known_file, local_model

pytestmark = [pytest.mark.real, pytest.mark.slow]
FREE_TEXT_KL = (
    5e-3  # bf16 against the trainer on high-entropy free text, where bf16's rounding of logits shows
)


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

    # bf16 by name: "auto" picks it only on CPUs with bf16 matrix units (models/dtypes.py), and the
    # agreement is a property of the arithmetic, whichever CPU runs it
    engine = HFEngine.from_pretrained(smollm2, device="cpu", dtype="bfloat16", cpu_threads=2)
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
