"""Prompts and the append-only token framing of a node's conversation.

A node's conversation is ONE token sequence: the rendered system+user prompt, then per turn the
sampled tokens followed by the observation tokens. The observation framing (end of the assistant
turn, a user turn with the output, the next assistant header) is read off the tokenizer's own chat
template once, so any model family works without re-tokenising earlier turns.
"""

from __future__ import annotations

import re

from rao_core.agent.parsing import ReplyFormat
from rao_core.config import AgentConfig
from rao_core.envs.base import Environment

_A, _O = "\x00ASSISTANT\x00", "\x00OBSERVATION\x00"


class ChatFraming:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        probe = [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": _A},
            {"role": "user", "content": _O},
        ]
        text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        if _A not in text or _O not in text:
            raise ValueError("the tokenizer's chat template drops assistant or user content")
        self.obs_prefix, self.obs_suffix = text.split(_A, 1)[1].split(_O, 1)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def initial_ids(self, system: str, user: str) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(text)

    def observation_ids(self, observation: str) -> list[int]:
        return self.encode(self.obs_prefix + observation + self.obs_suffix)


def system_prompt(env: Environment, fmt: ReplyFormat, cfg: AgentConfig, recursive: bool) -> str:
    parts = [
        "You are an agent that solves tasks by writing Python in a REPL.",
        fmt.instructions,
        env.tool_docs(recursive),
        "Call finish(message) when the task is done; your message is your answer.",
    ]
    if recursive:
        parts.append(
            f"Sub-agents are copies of you with a fresh context; they see only the goal you give them. "
            f"Depth limit: {cfg.max_depth}."
        )
    return "\n\n".join(parts)


def user_prompt(env: Environment, depth: int, cfg: AgentConfig) -> str:
    return f"Goal: {env.goal_text()}\nYou are at depth {depth}. You have {cfg.max_steps} steps."


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def mask_addresses(text: str) -> str:
    """`<function sub at 0x7f3a74544cc0>` -> `<function sub>`: an object's address differs from
    one worker process to the next (ASLR), so a seeded rerun would otherwise see other tokens."""
    return _ADDRESS.sub(">", text)


def truncate(text: str, limit: int) -> str:
    """Keep the head and tail of long output; the model sees what was cut."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"
