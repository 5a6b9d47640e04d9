"""A small OpenAI-compatible server in front of an HFEngine (FastAPI + uvicorn, 127.0.0.1 only).

Why: evaluation code and judges speak the OpenAI HTTP API, and the OpenAIEngine client must be
testable without vLLM. Like vLLM with `return_tokens_as_token_ids`, completions report each
sampled token as "token_id:<n>" with its log-prob, so a client can train on what it gets back.
`token_ids=False` mimics a server that returns only token strings (hosted APIs).

    python -m rao_core.engines.server --model tiny --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict

from rao_core.engines.hf import HFEngine
from rao_core.policy import GenerationRequest


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = 16
    temperature: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: int | None = None
    return_tokens_as_token_ids: bool = True
    n: int = 1


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    stop: str | list[str] | None = None


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


def create_app(engine: HFEngine, model_name: str = "tiny", token_ids: bool = True) -> FastAPI:
    app = FastAPI(title="rao engine server")
    tok = engine.tokenizer

    async def run(prompt_ids: list[int], max_tokens: int, temperature: float, stop, seed: int | None = None):
        if not prompt_ids:
            raise HTTPException(400, "empty prompt")
        req = GenerationRequest(prompt_ids, max_tokens, _stops(stop), None, temperature, seed)  # type: ignore[arg-type]
        return await engine.generate(req)

    def usage(prompt_ids: list[int], completion: list[int]) -> dict:
        n, m = len(prompt_ids), len(completion)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "rao"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> dict:
        p = body.prompt
        if body.n != 1 or (isinstance(p, list) and p and not isinstance(p[0], int) and len(p) != 1):
            raise HTTPException(400, "one prompt and n=1 per request")
        if isinstance(p, list) and p and isinstance(p[0], list | str):
            p = p[0]
        ids = tok.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p)
        gen = await run(ids, body.max_tokens, body.temperature, body.stop, body.seed)
        logprobs = None
        if body.logprobs is not None:
            as_ids = token_ids and body.return_tokens_as_token_ids
            logprobs = {
                "tokens": [f"token_id:{i}" if as_ids else tok.decode([i]) for i in gen.token_ids],
                "token_logprobs": gen.logprobs,
                "top_logprobs": None,
                "text_offset": None,
            }
        choice = {"index": 0, "text": gen.text, "logprobs": logprobs, "finish_reason": gen.finish_reason}
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": usage(ids, gen.token_ids),
        }

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody) -> dict:
        text = tok.apply_chat_template(body.messages, tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        max_tokens = body.max_completion_tokens or body.max_tokens or 512
        gen = await run(ids, max_tokens, body.temperature, body.stop)
        message = {"role": "assistant", "content": gen.text}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": gen.finish_reason}],
            "usage": usage(ids, gen.token_ids),
        }

    return app


def serve(engine: HFEngine, host: str = "127.0.0.1", port: int = 8000, **app_kw) -> None:
    uvicorn.run(create_app(engine, **app_kw), host=host, port=port, log_level="warning")


def start_background(engine: HFEngine, port: int = 0, **app_kw) -> tuple[str, Callable[[], None]]:
    """Serve on 127.0.0.1 in a daemon thread (its own event loop); returns (base URL, stop)."""
    config = uvicorn.Config(create_app(engine, **app_kw), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True, name="rao-server")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the engine server did not start")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    return f"http://127.0.0.1:{bound}/v1", stop


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve a local checkpoint over the OpenAI API")
    ap.add_argument("--model", default="tiny", help="'tiny' or a local checkpoint folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    serve(
        HFEngine.from_pretrained(args.model, device=args.device), args.host, args.port, model_name=args.model
    )


if __name__ == "__main__":
    main()
