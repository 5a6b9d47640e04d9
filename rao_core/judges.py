"""Judges as models: `ModelJudge` (any engine behind the Policy interface: transformers, vLLM, an
OpenAI-compatible server, handed to it) and `build_judge`, the judge a configuration names, handed
its engine (rao_core/engines/open.py). The interface and the scripted judge are in
rao_core/verdicts.py. See docs/judges.md.
"""

from __future__ import annotations

from pathlib import Path

from rao_core.agent.prompts import ChatFraming, truncate
from rao_core.config import JudgeConfig
from rao_core.engines.open import JudgeEngine
from rao_core.layout import RunLayout
from rao_core.policy import GenerationRequest, Policy
from rao_core.verdicts import (
    MAX_FIELD_CHARS,
    RUBRIC,
    Judge,
    JudgeCache,
    ScriptedJudge,
)


def judge_prompt(goal: str, answer: str, reference: str | None) -> str:
    ref = truncate(reference, MAX_FIELD_CHARS) if reference is not None else "(none)"
    return (
        f"Goal:\n{truncate(goal, MAX_FIELD_CHARS)}\n\nAnswer:\n{truncate(answer, MAX_FIELD_CHARS)}"
        f"\n\nReference answer:\n{ref}\n\nYour verdict (one JSON object):"
    )


class ModelJudge(Judge):
    """A language model with the rubric as system prompt, framed by its tokenizer's chat template
    and sampled through any engine (the engine's batching serves every pending verdict at once)."""

    def __init__(
        self,
        engine: Policy,
        tokenizer,
        name: str,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        cache: JudgeCache | None = None,
        attempts: int = 3,
        rubric: str = RUBRIC,
    ) -> None:
        super().__init__(name, cache, attempts, rubric)
        self.engine, self.chat = engine, ChatFraming(tokenizer)
        self.max_new_tokens, self.temperature = max_new_tokens, temperature

    async def reply(self, goal: str, answer: str, reference: str | None) -> str:
        ids = self.chat.initial_ids(self.rubric, judge_prompt(goal, answer, reference))
        request = GenerationRequest(ids, self.max_new_tokens, (), None, self.temperature)  # type: ignore[arg-type]
        return (await self.engine.generate(request)).text

    async def close(self) -> None:
        await self.engine.close()


def build_judge(
    cfg: JudgeConfig, run_dir: str | Path | None, engine: JudgeEngine | None = None
) -> Judge | None:
    """The judge named by `cfg.kind`, caching under `<run_dir>/judge_cache/`; None for kind none. A
    model judge is handed its engine (rao_core/engines/open.py: open_judge_engine)."""
    if cfg.kind == "none":
        return None
    folder = RunLayout(Path(run_dir)).judge_cache if run_dir is not None else None
    cache = JudgeCache(folder) if cfg.cache else None
    if cfg.kind == "scripted":
        return ScriptedJudge(cache)
    if engine is None:
        raise ValueError(f"judge.kind: {cfg.kind}: a model judge is handed its engine (open_judge_engine)")
    rubric = Path(cfg.rubric).read_text() if cfg.rubric else RUBRIC
    return ModelJudge(
        engine.engine,
        engine.tokenizer,
        engine.name,
        cfg.max_new_tokens,
        cfg.temperature,
        cache,
        cfg.retries,
        rubric,
    )
