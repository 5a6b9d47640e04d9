"""The OpenAI-compatible server and client: the same greedy tokens as HFEngine, token ids and
log-probs round-trip, a clear error when a server cannot feed training, chat completions."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from rao_core.config import HFPolicy, OpenAIPolicy, ScriptedPolicy
from rao_core.engines import build_engine
from rao_core.engines.hf import HFEngine
from rao_core.engines.openai import OpenAIEngine, ServerReplyError
from rao_core.engines.server import start_background
from rao_core.models.tokenizer import tiny_tokenizer
from tests.engines import chain_model, req, small_model
from tests.engines.test_hf_engine import prompts

TOK = tiny_tokenizer()


@pytest.fixture(scope="module")
def ref():
    return small_model(TOK)  # never given to an engine: stock attention


@pytest.fixture(scope="module")
def server():
    url, stop = start_background(HFEngine(small_model(TOK), TOK))
    yield url
    stop()


def ask(engine, requests):
    async def main():
        try:
            return await asyncio.gather(*[engine.generate(r) for r in requests])
        finally:
            await engine.close()

    return asyncio.run(main())


def test_openai_engine_agrees_with_hf_engine(server, ref):
    ps = prompts(8, seed=7)
    via_http = ask(OpenAIEngine(server, "tiny", TOK), [req(p, 10) for p in ps])
    local = ask(HFEngine(small_model(TOK), TOK), [req(p, 10) for p in ps])
    for p, a, b in zip(ps, via_http, local, strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        expected = ref.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False)[0, len(p) :]
        assert a.token_ids == expected.tolist()


def test_sampled_logprobs_round_trip(server, ref):
    p = prompts(1, seed=8)[0]
    (g,) = ask(OpenAIEngine(server, "tiny", TOK), [req(p, 12, temperature=0.7)])
    with torch.no_grad():
        logits = ref(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1]
    expected = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert torch.allclose(expected, torch.tensor(g.logprobs), atol=1e-4)


def test_stop_strings_through_http():
    model, chain = chain_model(TOK)
    url, stop = start_background(HFEngine(model, TOK))
    try:
        (g,) = ask(OpenAIEngine(url, "tiny", TOK), [req(chain[:1], 10, stop=["</python>"])])
    finally:
        stop()
    assert g.token_ids == chain[1:5] and g.text == "k</python>" and g.finish_reason == "stop"


def test_server_without_token_ids_cannot_feed_training():
    url, stop = start_background(HFEngine(small_model(TOK), TOK), token_ids=False)
    try:
        p = prompts(1, seed=9)[0]
        with pytest.raises(ServerReplyError, match="cannot feed training"):
            ask(OpenAIEngine(url, "tiny", TOK, for_training=True), [req(p, 6)])
        (g,) = ask(OpenAIEngine(url, "tiny", TOK, for_training=False), [req(p, 6)])
        assert g.logprobs is None and TOK.decode(g.token_ids) == g.text  # tokenised locally
    finally:
        stop()


def test_models_chat_and_string_prompts(server):
    with httpx.Client(base_url=server, timeout=30) as client:
        assert client.get("/models").json()["data"][0]["id"] == "tiny"
        chat = client.post(
            "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0},
        ).json()
        assert chat["choices"][0]["message"]["role"] == "assistant"
        assert chat["usage"]["completion_tokens"] <= 5
        text = client.post(
            "/completions", json={"prompt": "craft", "max_tokens": 4, "temperature": 0, "logprobs": 0}
        ).json()
        ids = client.post(
            "/completions",
            json={"prompt": TOK.encode("craft"), "max_tokens": 4, "temperature": 0, "logprobs": 0},
        ).json()
        assert text["choices"][0]["text"] == ids["choices"][0]["text"]
        assert ids["choices"][0]["logprobs"]["tokens"][0].startswith("token_id:")
        assert client.post("/completions", json={"prompt": [], "max_tokens": 2}).status_code == 400


def test_build_engine_kinds(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", "secret")
    cfg = OpenAIPolicy(base_url="http://127.0.0.1:1/v1", api_key_env="MY_KEY", served_model="m")
    engine = build_engine(cfg, TOK)
    assert isinstance(engine, OpenAIEngine) and engine.headers["Authorization"] == "Bearer secret"
    monkeypatch.chdir(tmp_path)  # 'tiny' is built and cached under ./runs/_models
    hf = build_engine(HFPolicy(model="tiny", device="cpu", max_batch_size=7, engine_processes=0), TOK)
    assert isinstance(hf, HFEngine) and hf.max_batch_size == 7 and hf.device.type == "cpu"
    assert list((tmp_path / "runs" / "_models").iterdir())
    with pytest.raises(ValueError, match="not a model engine"):
        build_engine(ScriptedPolicy(), TOK)
