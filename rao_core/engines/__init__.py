"""Model engines behind the one `Policy` interface: transformers (CPU/GPU), vLLM (GPU), HTTP.

Imports are lazy so that the CPU install never needs vLLM and the scripted path never loads torch.
"""

from __future__ import annotations

import os

from rao_core.agent.policy import Policy
from rao_core.config import PolicyConfig


def build_engine(policy_cfg: PolicyConfig, tokenizer) -> Policy:
    """The engine named by `policy_cfg.kind` (hf, vllm or openai), serving `policy_cfg.model`."""
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
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "policy.kind=vllm needs vLLM, which is not installed here. It is a GPU-only extra with "
                "its own torch/transformers pins: install it in a separate environment with "
                "`pip install -e '.[vllm]'` (see docs/engines.md)."
            ) from e
        from rao_core.engines.vllm import VLLMEngine

        return VLLMEngine.from_config(policy_cfg, tokenizer)
    if kind == "openai":
        from rao_core.engines.openai import OpenAIEngine

        return OpenAIEngine(
            policy_cfg.base_url,
            policy_cfg.served_model or policy_cfg.model,
            tokenizer,
            api_key=os.environ.get(policy_cfg.api_key_env) if policy_cfg.api_key_env else None,
        )
    raise ValueError(f"policy.kind: {kind!r} is not a model engine (hf, vllm, openai)")
