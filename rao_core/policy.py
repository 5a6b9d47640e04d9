"""The one async interface between the agent runtime and whatever writes the replies.

Model engines (transformers, vLLM, HTTP) read `prompt_ids` and return sampled ids with their
log-probs; a scripted policy reads the node's state instead and returns text (the runtime then
tokenises it). Either way the runtime stores exactly the ids it is given.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from rao_core.envs.base import Environment


@dataclass
class NodeState:
    """What a scripted policy may look at. Model engines ignore it."""

    node_id: str
    depth: int
    max_depth: int
    recursive: bool
    env: Environment
    turn: int = 0
    last_observation: str = ""
    rng: random.Random = field(default_factory=random.Random)
    memory: dict[str, Any] = field(default_factory=dict)  # the policy's own per-node scratch


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...]
    node: NodeState
    temperature: float = 1.0  # 0 means greedy
    seed: int | None = None  # the request's own sampling seed (None: the engine's shared generator)


@dataclass
class Generation:
    text: str
    token_ids: list[int] | None = None  # None: the runtime tokenises `text` (scripted policies)
    logprobs: list[float] | None = None  # one per token id, under the sampling distribution
    finish_reason: str = "stop"  # stop, length, context


class Policy(ABC):
    version: int = 0

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> Generation: ...

    async def close(self) -> None:
        return None
