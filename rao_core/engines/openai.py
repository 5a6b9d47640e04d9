"""A client for any OpenAI-compatible server (vLLM, our own server.py, hosted APIs).

It posts the prompt as token ids to /v1/completions, so the server sees exactly the tokens the
runtime built (no re-tokenisation drift), and asks for the sampled token ids and their log-probs
back (vLLM: `return_tokens_as_token_ids`, `logprobs=0`). Training needs both. A server that
returns only text can still be used to evaluate (`for_training=False`): the reply is then
tokenised locally, which is close to, but not guaranteed to be, what the model sampled.
"""

from __future__ import annotations

import asyncio

import httpx

from rao_core.policy import Generation, GenerationRequest, Policy

TOKEN_ID_PREFIX = "token_id:"


class ServerReplyError(RuntimeError):
    pass


class OpenAIEngine(Policy):
    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer,
        api_key: str | None = None,
        for_training: bool = True,
        vllm_extras: bool = True,
        timeout_s: float = 600.0,
        max_connections: int = 256,
    ) -> None:
        """`vllm_extras` sends vLLM's extra sampling fields (token ids back, stop string kept in
        the text); turn it off for servers that reject unknown fields."""
        self.base_url, self.model, self.tokenizer = base_url.rstrip("/"), model, tokenizer
        self.for_training, self.vllm_extras = for_training, vllm_extras
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        """One connection pool per event loop (httpx clients cannot cross loops)."""
        loop = asyncio.get_running_loop()
        for lp in [lp for lp in self._clients if lp.is_closed()]:
            del self._clients[lp]
        if loop not in self._clients:
            limits = httpx.Limits(max_connections=self.max_connections)
            self._clients[loop] = httpx.AsyncClient(
                headers=self.headers, timeout=self.timeout_s, limits=limits
            )
        return self._clients[loop]

    async def generate(self, request: GenerationRequest) -> Generation:
        body: dict = {
            "model": self.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": request.max_new_tokens,
            "temperature": request.temperature,
            "logprobs": 0,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed  # vLLM: a per-request generator, reproducible samples
        if self.vllm_extras:
            body |= {
                "return_tokens_as_token_ids": True,
                "include_stop_str_in_output": True,  # the runtime parses up to '</python>'
                "skip_special_tokens": True,
            }
        resp = await self._client().post(f"{self.base_url}/completions", json=body)
        if resp.status_code != 200:
            raise ServerReplyError(f"{self.base_url}/completions: HTTP {resp.status_code}: {resp.text[:500]}")
        return self._parse(resp.json(), request)

    def _parse(self, data: dict, request: GenerationRequest) -> Generation:
        choice = data["choices"][0]
        text, finish = choice.get("text") or "", choice.get("finish_reason") or "stop"
        lp = choice.get("logprobs") or {}
        tokens, values = lp.get("tokens"), lp.get("token_logprobs")
        ids = _token_ids(tokens)
        if ids is not None and values is not None and len(values) == len(ids) and None not in values:
            return Generation(text, ids, [float(v) for v in values], finish)
        if self.for_training:
            raise ServerReplyError(
                f"{self.base_url} cannot feed training: the server returned no token ids/log-probs "
                "for the sampled tokens; use it for evaluation only (for_training=False) or serve the "
                "model with vLLM (it honours return_tokens_as_token_ids and logprobs) or with "
                "rao_core.engines.server"
            )
        stop_reason = choice.get("stop_reason")
        if finish == "stop" and not any(s in text for s in request.stop):
            # OpenAI-style servers cut the stop string off; put it back so the cell parses.
            if isinstance(stop_reason, str):
                text += stop_reason
            elif "stop_reason" not in choice and len(request.stop) == 1:  # a guess: eval only
                text += request.stop[0]
        return Generation(text, self.tokenizer.encode(text, add_special_tokens=False), None, finish)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()


def _token_ids(tokens: list | None) -> list[int] | None:
    """vLLM's return_tokens_as_token_ids reports 'token_id:123'; anything else is not an id."""
    if not tokens or not all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return [] if tokens == [] else None
    return [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
