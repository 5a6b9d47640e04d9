"""Model engines behind the one `Policy` interface: transformers (CPU/GPU), vLLM (a managed server,
CPU or GPU), any OpenAI-compatible server. docs/engines.md says which to use when.

Imports are lazy so that the scripted path never loads torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from rao_core.config import PolicyConfig
from rao_core.config.types import device_type
from rao_core.policy import Policy


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
    own limit), serving adapters up to `lora_rank` (train.lora); hf: the same limit, at most the
    model's, sizes its K/V slots on a GPU."""
    kind = policy_cfg.kind
    if kind == "hf":
        c = policy_cfg
        kw = dict(
            device=c.device,
            dtype=c.dtype,
            max_batch_size=c.max_batch_size,
            max_batch_tokens=c.max_batch_tokens,
            decode=c.decode,
            cuda_graphs=c.cuda_graphs,
            context_limit=max_model_len,  # the agent's context: what the K/V slots' columns need at most
            sampler=c.sampler,
        )
        processes = engine_processes(c)
        kw["cpu_threads"] = cpu_threads(c, processes)
        if processes:  # the current scope's children for `role` (hf_process.py)
            from rao_core.engines.hf_process import EngineSpec, process_engine

            return process_engine(EngineSpec(str(c.model), tokenizer, **kw), role, processes)
        from rao_core.engines.hf import HFEngine

        return HFEngine.from_pretrained(c.model, tokenizer, **kw)
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


def engine_processes(c: PolicyConfig) -> int:
    """policy.engine_processes with 'auto' resolved: on CPU one replica per core up to 4, none
    (the engine in this process) with one core or on a GPU."""
    if c.engine_processes != "auto":
        return c.engine_processes
    import torch

    if device_type(c.device) == "cuda" or (c.device == "auto" and torch.cuda.is_available()):
        return 0
    cores = usable_cores()
    return min(cores, 4) if cores > 1 else 0


def cpu_threads(c: PolicyConfig, processes: int) -> int:
    """policy.cpu_threads with 'auto' resolved: the cores shared among `processes` child engines,
    1 for an engine in this process (the trees' event loop and the REPL workers share its cores)."""
    if c.cpu_threads != "auto":
        return c.cpu_threads
    return max(1, usable_cores() // processes) if processes else 1


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
