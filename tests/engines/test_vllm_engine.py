"""VLLMEngine on a GPU (skipped here: no CUDA, no vLLM). Run in the vLLM environment with
`pytest -m gpu tests/engines/test_vllm_engine.py`."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch

from rao_core.models.tiny import build_tiny_model, save_checkpoint
from rao_core.models.tokenizer import tiny_tokenizer
from tests.engines import req

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
]

TOK = tiny_tokenizer()


def test_vllm_engine_generates_reloads_and_reports_logprobs(tmp_path):
    from rao_core.engines.vllm import VLLMEngine

    first, second = build_tiny_model(TOK, seed=0), build_tiny_model(TOK, seed=1)
    save_checkpoint(first, TOK, tmp_path / "a")
    save_checkpoint(second, TOK, tmp_path / "b")
    prompt = TOK.encode("<|im_start|>user\ncraft m0_i1_2<|im_end|>\n<|im_start|>assistant\n")

    async def main():
        engine = VLLMEngine(tmp_path / "a", dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True)
        try:
            greedy = await asyncio.gather(*[engine.generate(req(prompt, 16)) for _ in range(4)])
            sampled = await engine.generate(req(prompt, 16, temperature=0.7))
            await engine.load_checkpoint(tmp_path / "b")
            after = await engine.generate(req(prompt, 16))
            return greedy, sampled, after, engine.version
        finally:
            await engine.close()

    greedy, sampled, after, version = asyncio.run(main())
    assert all(g.token_ids == greedy[0].token_ids for g in greedy)
    ref = first.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt) :]
    assert greedy[0].token_ids == ref.tolist()[: len(greedy[0].token_ids)]
    with torch.no_grad():  # log-probs are temperature-scaled ("processed")
        logits = first(torch.tensor([prompt + sampled.token_ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(sampled.token_ids)[:, None])[:, 0]
    assert torch.allclose(expected, torch.tensor(sampled.logprobs), atol=1e-2)
    ref_b = second.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt) :]
    assert after.token_ids == ref_b.tolist()[: len(after.token_ids)] and version == 1
