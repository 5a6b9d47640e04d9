"""Engines are opened here, and only here, for a role: the policy (the model being trained, with
its LoRA rank and its place under Ray) or the judge. Stages ask for an engine; judges are handed one.

    engine, tokenizer = open_policy_engine(cfg.policy, checkpoint, context=4096, lora_rank=8)
    judge_engine = open_judge_engine(cfg.judge)      # None for the kinds that need no model
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rao_core.config import ConfigError, HFPolicy, JudgeConfig, PolicyConfig, VLLMPolicy
from rao_core.policy import Policy


def placed(policy: PolicyConfig, on_ray: bool, overlap: bool = False) -> PolicyConfig:
    """policy.* as the engines see it: under rollout.runner=ray, `engine_processes: auto` is 0
    (each Ray task is already an engine replica; docs/engines.md); when rounds overlap on the CPU
    (campaign.max_staleness >= 1), at most the engines' share of the cores (`overlap_share`)."""
    if getattr(policy, "engine_processes", None) != "auto":
        return policy
    if on_ray:
        return dataclasses.replace(policy, engine_processes=0)
    if overlap:
        from rao_core.engines import engine_processes

        n = engine_processes(policy)  # 0 on a GPU: the engine there is in this process
        return dataclasses.replace(policy, engine_processes=min(n, overlap_share()[0]))
    return policy


def overlap_share() -> tuple[int, int]:
    """When rounds overlap on the CPU: (engine processes, trainer threads). The engine lane and the
    trainer run at once, so each gets part of the cores instead of all of them (which would run
    twice as many threads as cores): the trainer half (at least one), the engines the rest, one
    core each. 2 cores: one engine process and one trainer thread (docs/overlap.md)."""
    from rao_core.engines import usable_cores

    cores = usable_cores()
    trainer = max(1, cores // 2)
    return max(1, cores - trainer), trainer


def open_policy_engine(
    policy: PolicyConfig, model: Path, context: int | None = None, lora_rank: int = 0, on_ray: bool = False,
    role: str = "policy", overlap: bool = False,
) -> tuple[Policy, Any]:  # fmt: skip
    """An engine serving checkpoint `model` with the settings of `policy` (hf, vllm or openai), with
    the tokenizer that frames the conversation: policy.tokenizer, or with 'auto' the checkpoint's.
    A vLLM server, and the hf engine's child processes, come from the current EngineScope
    (engines/scope.py), keyed by `role`."""
    from rao_core.engines import build_engine
    from rao_core.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(model) if policy.tokenizer == "auto" else policy.tokenizer)
    cfg = dataclasses.replace(placed(policy, on_ray, overlap), model=str(model))
    return build_engine(cfg, tokenizer, context, lora_rank=lora_rank, role=role), tokenizer


def start_policy_processes(policy: PolicyConfig, on_ray: bool = False, overlap: bool = False) -> None:
    """Start the hf engine's child processes now, so that their imports overlap the work before the
    first rollout (a campaign's engine scope, rao_core/campaign.py)."""
    if policy.kind == "hf":
        from rao_core.engines.hf_process import start_processes

        start_processes(placed(policy, on_ray, overlap))


@dataclass(frozen=True)
class JudgeEngine:
    """An opened judge model: the engine, the tokenizer that frames its prompt, and its name."""

    engine: Policy
    tokenizer: Any
    name: str


def open_judge_engine(cfg: JudgeConfig) -> JudgeEngine | None:
    """The engine of a model judge (judge.kind hf, vllm or openai); None for kinds none and scripted."""
    if cfg.kind in ("none", "scripted"):
        return None
    if not cfg.model:
        raise ConfigError(f"judge.model: needed by kind {cfg.kind} ('tiny' or a local Hugging Face folder)")
    from rao_core.models.tiny import resolve_model
    from rao_core.models.tokenizer import load_tokenizer

    if cfg.kind == "openai":
        if not cfg.base_url:
            raise ConfigError("judge.base_url: needed by kind openai")
        from rao_core.engines.openai import OpenAIEngine

        name = cfg.served_model or cfg.model
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        tokenizer = load_tokenizer(cfg.model)  # only frames the prompt; the server holds the weights
        engine = OpenAIEngine(
            cfg.base_url, name, tokenizer, api_key=key, for_training=False, vllm_extras=False
        )
        return JudgeEngine(engine, tokenizer, name)
    from rao_core.engines import build_engine

    path = str(resolve_model(cfg.model))
    tokenizer = load_tokenizer(path)
    policy = (
        VLLMPolicy(model=path, gpu_memory_utilization=cfg.gpu_memory_utilization)
        if cfg.kind == "vllm"
        else HFPolicy(model=path)
    )
    return JudgeEngine(build_engine(policy, tokenizer, role="judge"), tokenizer, cfg.model)
