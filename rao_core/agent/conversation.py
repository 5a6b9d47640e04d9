"""A node's conversation as the trainer reads it: ONE token sequence (the prompt, then per turn the
sampled tokens and the observation tokens, append-only), a mask over the sampled tokens, and the
sampler's log-prob of each sampled token. Stored as it is, never re-tokenised (rao-method.md 3)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Conversation:
    ids: list[int]
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # up to the last reply that had log-probs

    def __post_init__(self) -> None:
        self.mask = self.mask or [0] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def add_reply(self, ids: list[int], logprobs: list[float] | None) -> None:
        """Sampled tokens (mask 1); their log-probs when the policy gives them (a model does, a
        scripted policy does not), 0 for every token before them."""
        self.ids, self.mask = self.ids + ids, self.mask + [1] * len(ids)
        if logprobs is not None:
            self.logprobs += [0.0] * (len(self.ids) - len(ids) - len(self.logprobs)) + list(logprobs)

    def add_observation(self, ids: list[int]) -> None:
        self.ids, self.mask = self.ids + ids, self.mask + [0] * len(ids)

    def stored_logprobs(self) -> list[float]:
        """One per token (0 off the sampled ones), or none at all for a policy without log-probs."""
        return self.logprobs + [0.0] * (len(self.ids) - len(self.logprobs)) if self.logprobs else []
