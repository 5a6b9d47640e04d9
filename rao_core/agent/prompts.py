"""Prompts and the append-only token framing of a node's conversation.

A node's conversation is ONE token sequence: the rendered system+user prompt, then per turn the
sampled tokens followed by the observation tokens. The observation framing (end of the assistant
turn, a user turn with the output, the next assistant header) is read off the tokenizer's own chat
template once, so any model family works without re-tokenising earlier turns. Template arguments
(`policy.chat_template_kwargs`, e.g. Qwen3's `enable_thinking: false`) are passed to every
rendering; a template that refuses a system message (Gemma, some Mistral versions) gets the system
prompt at the top of the first user message instead.
"""

from __future__ import annotations

import re
from typing import Any

from jinja2.exceptions import TemplateError

from rao_core.agent.parsing import ReplyFormat
from rao_core.config import AgentConfig
from rao_core.envs.base import Environment

_S, _U, _A, _O = "\x00SYSTEM\x00", "\x00USER\x00", "\x00ASSISTANT\x00", "\x00OBSERVATION\x00"


class ChatFraming:
    def __init__(self, tokenizer, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.system_role = self._takes_system()
        probe = [*self.opening(_S, _U), {"role": "assistant", "content": _A}, {"role": "user", "content": _O}]
        text = self.render(probe)
        if _A not in text or _O not in text:
            raise ValueError("the tokenizer's chat template drops assistant or user content")
        self.obs_prefix, self.obs_suffix = text.split(_A, 1)[1].split(_O, 1)
        # The token that ends an assistant turn, when the framing starts with one: a model that
        # samples it itself (its eos) must not see it twice.
        first = self.encode(self.obs_prefix)[:1]
        self.turn_end = first[0] if first and first[0] in self._special_ids() else None

    def render(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.template_kwargs
        )

    def _takes_system(self) -> bool:
        """False when the template raises on a system message or leaves it out."""
        try:
            return _S in self.render([{"role": "system", "content": _S}, {"role": "user", "content": _U}])
        except TemplateError:
            return False

    def _special_ids(self) -> set[int]:
        added = getattr(self.tokenizer, "added_tokens_decoder", {})
        return set(self.tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}

    def opening(self, system: str, user: str) -> list[dict[str, str]]:
        """The first messages of a node: system + user, or one user message holding both."""
        if self.system_role:
            return [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return [{"role": "user", "content": f"{system}\n\n{user}"}]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def initial_ids(self, system: str, user: str) -> list[int]:
        return self.encode(self.render(self.opening(system, user)))

    def observation_ids(self, observation: str, after: list[int] | None = None) -> list[int]:
        """The tokens between a reply and the next: end of turn, the observation as a user turn,
        the next assistant header. `after`: the conversation so far; when the reply already ended
        with the end-of-turn token, it is not repeated."""
        ids = self.encode(self.obs_prefix + observation + self.obs_suffix)
        if after and self.turn_end is not None and after[-1] == self.turn_end and ids[:1] == [self.turn_end]:
            return ids[1:]
        return ids


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
