"""vLLM behind the Policy interface: token ids in, sampled ids and log-probs out, over HTTP to the
server that vllm_server.py manages (its own Python environment; docs/engines.md says why).

Each request carries its seed (vLLM's per-request generator, so reruns sample the same tokens) and
the server returns log-probs after temperature (`--logprobs-mode processed_logprobs`), the
distribution actually sampled from, as the trainer expects. If the server dies mid-rollout (killed,
crashed), the requests that were in flight wait while it is started again on the same checkpoint,
then go again with the same seeds: the trees complete as if nothing happened, and nothing is lost
or scored as a policy failure. A server that cannot come back raises EngineError (infra_error).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from rao_core.config import VLLMPolicy
from rao_core.engines.openai import OpenAIEngine
from rao_core.engines.scope import EngineScope, current_scope
from rao_core.engines.vllm_server import VLLMServer
from rao_core.policy import Generation, GenerationRequest, Policy

# What a request sees when the server process is gone or going.
SERVER_GONE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
RECOVERY_ATTEMPTS = (
    4  # a request's tries across restarts (a pooled connection to a dead server fails once more)
)


class VLLMEngine(Policy):
    def __init__(self, server: VLLMServer, tokenizer) -> None:
        self.server, self.tokenizer = server, tokenizer
        self.client = OpenAIEngine(server.base_url, server.served_name, tokenizer)  # an adapter's name
        self._recovering: asyncio.Future | None = None
        self._own_scope: EngineScope | None = None

    @classmethod
    def serving(
        cls,
        cfg: VLLMPolicy,
        model_dir: Path,
        tokenizer,
        max_model_len: int | None,
        role: str = "policy",
        lora_rank: int = 0,
    ) -> VLLMEngine:
        """The current EngineScope's vLLM server for `role`, made to serve `model_dir` (started, or
        loaded and verified); `lora_rank` > 0 serves LoRA adapters (train.lora). Outside any scope
        the engine gets a scope of its own, which ends (and stops the server) when it closes."""
        scope, own = current_scope(), None
        if scope is None:
            scope = own = EngineScope()
        server = scope.server(cfg, max_model_len, role, lora_rank)
        try:
            server.ensure(model_dir)
        except BaseException:
            if own is not None:
                own.close()
            raise
        engine = cls(server, tokenizer)
        engine._own_scope = own
        return engine

    async def generate(self, request: GenerationRequest) -> Generation:
        for attempt in range(RECOVERY_ATTEMPTS):
            try:
                return await self.client.generate(request)
            except SERVER_GONE:
                if attempt == RECOVERY_ATTEMPTS - 1:
                    raise
                await self._recover()  # a no-op when the server is healthy (a stale pooled connection)
        raise AssertionError("unreachable")

    async def _recover(self) -> None:
        """One restart shared by every request that found the server gone (in a thread: it takes a
        while). The server keeps its port, so the client and its pool stay as they are."""
        if self._recovering is None or self._recovering.done():
            self._recovering = asyncio.get_running_loop().run_in_executor(None, self.server.recover)
        await asyncio.shield(self._recovering)
        self.client.base_url = self.server.base_url.rstrip("/")
        self.client.model = self.server.served_name

    async def close(self) -> None:
        """Closes this client; the server lives on for the next stage of its scope (or stops here
        when the engine had a scope of its own)."""
        await self.client.close()
        if self._own_scope is not None:
            self._own_scope.close()
