"""vLLM behind the Policy interface (GPU; a separate environment: `pip install -e '.[vllm]'`).

UNTESTED HERE: this machine has no GPU and no vLLM, so the code below was written against the
vLLM 0.33 API as documented (AsyncLLM / AsyncEngineArgs / SamplingParams / TokensPrompt,
`logprobs_mode`, `collective_rpc("reload_weights", kwargs={"weights_path": ...})`) and is
exercised only by tests/engines/test_vllm_engine.py, marked `gpu`, which skips without CUDA+vLLM.

What vLLM adds over HFEngine: paged attention, continuous batching and prefix caching (a node's
next turn re-uses the KV blocks of its previous turns). The contract is the same: prompts are
token ids, the reply carries the sampled ids and their log-probs under the distribution sampled
from (`logprobs_mode="processed_logprobs"`: after temperature; greedy requests get T = 1 log-probs),
and stop strings stay in the text (`include_stop_str_in_output`), as the cell parser needs them.

One VLLMEngine serves one event loop (vLLM's output handler binds to the loop of the first call).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from rao_core.agent.policy import Generation, GenerationRequest, Policy
from rao_core.config import PolicyConfig
from rao_core.models.tiny import resolve_model


class VLLMEngine(Policy):
    def __init__(
        self,
        model: str | Path,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.85,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        seed: int = 0,
        version: int = 0,
        **engine_kw: Any,
    ) -> None:
        """`model` is a local checkpoint folder (with its tokenizer). dtype 'auto' means bfloat16,
        the project-wide GPU default (vLLM's own 'auto' would pick float16 for float32 weights)."""
        self.engine_kw = dict(
            model=str(model),
            dtype="bfloat16" if dtype == "auto" else dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            seed=seed,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            **engine_kw,
        )
        self.version = version
        self.engine = self._start(self.engine_kw)
        self.max_model_len = self.engine.model_config.max_model_len

    @staticmethod
    def _start(kw: dict):
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))

    @classmethod
    def from_config(cls, cfg: PolicyConfig, tokenizer=None) -> VLLMEngine:
        """The tokenizer argument is unused: vLLM loads the checkpoint's own, which must be the
        one the runtime frames prompts with (save_checkpoint writes both together)."""
        return cls(
            resolve_model(cfg.model),
            dtype=cfg.dtype,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            tensor_parallel_size=cfg.tensor_parallel_size,
        )

    async def generate(self, request: GenerationRequest) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        room = self.max_model_len - len(request.prompt_ids)
        if room <= 0:
            return Generation("", [], [], "context")
        if request.max_new_tokens <= 0:
            return Generation("", [], [], "length")
        budget = min(request.max_new_tokens, room)
        params = SamplingParams(
            n=1,
            temperature=request.temperature,
            max_tokens=budget,
            stop=list(request.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's log-prob only
            skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
            seed=request.seed,
        )
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        final = None
        async for out in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
            final = out
        if final is None:
            raise RuntimeError("vLLM returned no output")
        c = final.outputs[0]
        ids = list(c.token_ids)
        logprobs = [float(entry[t].logprob) for entry, t in zip(c.logprobs or [], ids, strict=True)]
        finish = c.finish_reason or "stop"
        if finish == "length" and budget < request.max_new_tokens:
            finish = "context"
        return Generation(c.text, ids, logprobs, finish)

    async def load_checkpoint(self, path: str | Path, version: int | None = None) -> None:
        """Load new weights in place between rounds (no requests in flight): vLLM's documented
        reload path, then drop the prefix cache (its blocks hold the old policy's keys). Versions
        without `reload_weights` on the worker fall back to restarting the engine on `path`."""
        try:
            await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
            await self.engine.reset_prefix_cache()
        except (AttributeError, NotImplementedError, TypeError):
            self.engine.shutdown()
            self.engine_kw["model"] = str(path)
            self.engine = self._start(self.engine_kw)
        self.version = self.version + 1 if version is None else version

    async def update_weights(self, path: str | Path, version: int | None = None) -> None:
        await self.load_checkpoint(path, version)

    async def close(self) -> None:
        self.engine.shutdown()
