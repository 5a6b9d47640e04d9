"""Model engines behind the one `Policy` interface: transformers (CPU/GPU), vLLM (a managed server,
CPU or GPU), any OpenAI-compatible server. docs/engines.md says which to use when.

Imports are lazy so that the scripted path never loads torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from rao_core.agent.policy import Policy
from rao_core.config import PolicyConfig


def build_engine(
    policy_cfg: PolicyConfig,
    tokenizer,
    max_model_len: int | None = None,
    role: str = "policy",
    lora_rank: int = 0,
) -> Policy:
    """The engine named by `policy_cfg.kind` (hf, vllm or openai), serving `policy_cfg.model` (a
    whole model, or a LoRA adapter folder over its base). vllm: the current EngineScope's server
    for `role` (scope.py), holding at least `max_model_len` tokens per sequence (None: the model's
    own limit), serving adapters up to `lora_rank` (train.lora)."""
    kind = policy_cfg.kind
    if kind == "hf":
        from rao_core.engines.hf import HFEngine

        return HFEngine.from_pretrained(
            policy_cfg.model,
            tokenizer,
            device=policy_cfg.device,
            dtype=policy_cfg.dtype,
            max_batch_size=policy_cfg.max_batch_size,
            max_batch_tokens=policy_cfg.max_batch_tokens,
        )
    if kind == "vllm":
        from rao_core.engines.vllm import VLLMEngine

        return VLLMEngine.serving(
            policy_cfg, Path(policy_cfg.model), tokenizer, max_model_len, role, lora_rank
        )
    if kind == "openai":
        from rao_core.engines.openai import OpenAIEngine

        return OpenAIEngine(
            policy_cfg.base_url,
            policy_cfg.served_model or policy_cfg.model,
            tokenizer,
            api_key=os.environ.get(policy_cfg.api_key_env) if policy_cfg.api_key_env else None,
        )
    raise ValueError(f"policy.kind: {kind!r} is not a model engine (hf, vllm, openai)")
