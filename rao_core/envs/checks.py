"""What `rao train --check` (and every run, before its first stage's work) can see of the suite
that plain value checks cannot: whether it has the scripted expert a setting needs, whether its
task rows carry the labels it declares and hold enough tasks for the draws, which settings do
nothing for it, and (`--check` only) a smoke test of its scorer, in seconds:

    a few tasks of each difficulty the run uses: success() of an unfinished node, of an empty
      answer, and of the right answer where the suite knows it (a dataset's `answer` column)
    one tree per difficulty by the suite's expert (or its demonstrator), scored as in a rollout

A scorer bug found there costs nothing; found in a campaign it costs a round (rao_core/campaign.py).
Each refusal is one line naming the key or the scorer (docs/own-task.md, "Checked before any work").
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

from rao_core.agent.node import quiet_scorer_failures
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.tree import TreeSpec
from rao_core.config import (
    AgentConfig,
    EvalConfig,
    PolicyConfig,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
    ScriptedPolicy,
    WarmStartConfig,
)
from rao_core.envs.base import SUITE_SPECIFIC, ScorerError, Suite, score
from rao_core.envs.registry import SuiteError, import_object
from rao_core.models.tokenizer import load_tokenizer
from rao_core.policy import Policy
from rao_core.sampler import Sampler


class RunCheckError(ValueError):
    """A run that would fail later, refused now: one line naming the key."""


def has_expert(cls: type[Suite], warmstart: WarmStartConfig) -> bool:
    """Does the suite have a scripted expert to learn from: its own `expert()` or `demonstrator()`,
    or, for a suite that reads warmstart.demonstrator (a dataset), that setting?"""
    if cls.reads_demonstrator():
        return bool(warmstart.demonstrator) or cls.expert is not Suite.expert
    return cls.expert is not Suite.expert or cls.demonstrator is not Suite.demonstrator


def check_expert(cls: type[Suite], policy: PolicyConfig, warmstart: WarmStartConfig) -> None:
    """Settings that need the suite's scripted expert, or demonstrations that exist."""
    name = cls.__name__
    if policy.kind == "scripted" and cls.expert is Suite.expert:
        raise RunCheckError(
            f"policy.kind: 'scripted': {name} has no scripted expert (Suite.expert() returns None); "
            "use a model (policy.kind=hf) or write expert() (docs/own-task.md)"
        )
    demos = warmstart.demonstrations
    if demos and not Path(demos).exists():
        raise RunCheckError(f"warmstart.demonstrations: {demos!r}: no such file or folder")
    if warmstart.demonstrator and cls.reads_demonstrator():
        try:
            import_object(warmstart.demonstrator, "warmstart.demonstrator")
        except SuiteError as e:
            raise RunCheckError(str(e)) from None
    if policy.model == "warmstart" and not demos and not has_expert(cls, warmstart):
        more = " or warmstart.demonstrator (a function of yours)" if cls.reads_demonstrator() else ""
        raise RunCheckError(
            f"policy.model: 'warmstart': {name} has no scripted expert to learn from; set "
            f"warmstart.demonstrations (a Parquet file or folder of trees){more} or write expert() (docs/own-task.md)"
        )


def model_warnings(cls: type[Suite], policy: PolicyConfig, warmstart: WarmStartConfig) -> list[str]:
    """The shipped checkpoints are tiny TextCraft policies: for another suite, without a warm start,
    version 0 calls TextCraft's tools and solves nothing (each node ends in a loop or out of context).
    A warning naming the two ways out."""
    from rao_core.envs.suites import TextCraftData, TextCraftSmallData
    from rao_core.models.locate import is_shipped

    if issubclass(cls, TextCraftData | TextCraftSmallData) or policy.kind not in ("hf", "vllm"):
        return []
    if not is_shipped(policy.model):
        return []
    if cls.reads_demonstrator():
        warm = "a warm start from a demonstrator of yours (policy.model=warmstart, warmstart.demonstrator=module:function)"
    elif has_expert(cls, warmstart):
        warm = "a warm start from the suite's expert (policy.model=warmstart)"
    else:
        warm = "a warm start from demonstration trees (policy.model=warmstart, warmstart.demonstrations)"
    return [
        f"warning: policy.model: {policy.model!r} is a tiny TextCraft policy: it calls TextCraft's tools, not "
        f"those of suite {cls.__name__}, and will solve none of its tasks. Two ways out: {warm} on this "
        "machine, or a general instruction model on a GPU (policy.model=Org/Name, docs/scale-out.md); "
        "docs/own-task.md"
    ]


def unused_settings(cls: type[Suite], policy: PolicyConfig, warmstart: WarmStartConfig) -> list[str]:
    """Warnings, one line each: suite-specific settings (of policy.* and warmstart.*) changed from
    their default that this suite does not read (Suite.reads)."""
    out = []
    sections = {"policy": policy, "warmstart": warmstart}
    for key in SUITE_SPECIFIC:
        section, name = key.split(".")
        owner = sections[section]
        field = type(owner).__pydantic_fields__.get(name)
        if (
            key in cls.reads
            or field is None
            or getattr(owner, name) == field.get_default(call_default_factory=True)
        ):
            continue
        reads = ", ".join(k for k in SUITE_SPECIFIC if k in cls.reads) or "none of them"
        out.append(
            f"warning: {key}={getattr(owner, name)!r} does nothing for suite {cls.__name__}, which reads "
            f"{reads} of the suite-specific settings (Suite.reads, docs/own-task.md)"
        )
    return out


def check_tasks(suite: Suite, rollout: RolloutConfig, held_out: EvalConfig, strict: bool = True) -> list[str]:
    """The task rows carry only declared difficulties (else RunCheckError), and the draws have
    enough tasks: a round of rollout.num_tasks from rollout.split, eval.num_tasks per difficulty
    from eval.split. Too few: RunCheckError when `strict` (`--check`) and the number was set (a
    default takes what there is), else a warning line. Returns the warnings."""
    name = type(suite).__name__
    _, declared = type(suite).labels(suite.args)
    for split in sorted({rollout.split, held_out.split}):
        bad = sorted({t.difficulty for t in suite.tasks(split)} - set(declared))
        if bad:
            raise RunCheckError(
                f"suite {name}: {split} tasks have difficulty {bad[0]!r}, which {name} does not declare "
                f"(Suite.difficulties: {', '.join(declared)})"
            )
    short = []
    pool = [t for t in suite.tasks(rollout.split) if t.difficulty in rollout.difficulty]
    if len(pool) < rollout.num_tasks:
        short.append(
            f"rollout.num_tasks: {rollout.num_tasks}: more than the {len(pool)} {rollout.split} tasks of "
            f"difficulty {', '.join(rollout.difficulty)} in suite {name}"
        )
    val = suite.tasks(held_out.split)
    for d in held_out.difficulty:
        have = sum(t.difficulty == d for t in val)
        if have < held_out.num_tasks:
            short.append(
                f"eval.num_tasks: {held_out.num_tasks}: more than the {have} {held_out.split} tasks of "
                f"difficulty {d!r} in suite {name} (it is per difficulty)"
            )
    sections = {"rollout": rollout, "eval": held_out}
    asked = [line for line in short if not _default(sections, line.split(":")[0])]
    if asked and strict:  # a number the user set; a default simply takes what there is
        raise RunCheckError(asked[0])
    return [f"warning: {line}; the run draws what there is" for line in short]


def _default(sections: dict[str, Any], key: str) -> bool:
    """Is `section.field` at its default (not set by the user, the suite or a config file)?"""
    section, name = key.split(".")
    owner = sections[section]
    return getattr(owner, name) == type(owner).__pydantic_fields__[name].get_default(
        call_default_factory=True
    )


# -- the smoke test of the scorer (--check) ------------------------------------------------------
PER_DIFFICULTY = 3  # tasks probed per difficulty
TREE_SECONDS = 60.0  # an expert tree's wall clock here


def sample_tasks(suite: Suite, difficulties: list[str]) -> dict[str, list[Any]]:
    """The first few tasks of each difficulty (training split first, then held-out)."""
    pool = [*suite.tasks(suite.ctx.train_split), *suite.tasks(suite.ctx.eval_split)]
    return {d: [t for t in pool if t.difficulty == d][:PER_DIFFICULTY] for d in difficulties}


async def _probe(suite: Suite, tasks: dict[str, list[Any]]) -> list[tuple[str, str, float]]:
    """Score each task's root as unfinished and with an empty answer (a scorer must score any
    answer); returns (task id, reference answer, its score) where the environment knows one."""
    known = []
    for d, some in tasks.items():
        for task in some:
            env = suite.env(task)
            try:
                await score(env, False, "")
                await score(env, True, "")
                if (ref := env.reference_answer()) is not None:
                    known.append((task.task_id, ref, await score(env, True, ref)))
            except ScorerError as e:
                raise RunCheckError(f"task {task.task_id} ({d}): {e}") from None
    return known


def expert_trees(
    suite: Suite, expert: Policy, tasks: dict[str, list[Any]], agent: AgentConfig, sandbox: SandboxConfig,
    tokenizer: str,
) -> list[str]:  # fmt: skip
    """One expert tree per difficulty, run and scored as in a rollout; warnings (RunCheckError for a
    scorer that broke the contract at any node)."""
    name = type(suite).__name__
    specs = [TreeSpec(some[0].task_id, 0, suite.env(some[0]), d) for d, some in tasks.items() if some]
    agent = dataclasses.replace(agent, tree_timeout_s=min(agent.tree_timeout_s, TREE_SECONDS))
    chat = ChatFraming(load_tokenizer("tiny" if tokenizer == "auto" else tokenizer))
    with quiet_scorer_failures():  # refused below, in one line
        runs = Sampler(expert, chat, agent, sandbox, None, 1.0, len(specs)).run(specs)
    for run in runs:
        for r in run.records:
            if r.status == "infra_error":  # the scorer's, or the expert's own bug
                why = r.finish_message.removeprefix("scorer: ").replace("engine: ", "the expert raised ", 1)
                raise RunCheckError(
                    f"the expert's tree of {run.spec.task_id} ({name}), node {r.node_id}: {why}"
                )
    roots = {run.spec.difficulty: next(r for r in run.records if r.parent_id is None) for run in runs}
    if roots and all(r.success == 0 for r in roots.values()):
        ended = Counter(r.status for r in roots.values())
        return [
            f"warning: suite {name}: its expert's trees score 0 at every difficulty ({', '.join(roots)}; the "
            f"roots ended: {', '.join(f'{k} {v}' for k, v in sorted(ended.items()))}): is success() right, and "
            "does agent.max_steps leave the expert the turns it needs? (docs/own-task.md)"
        ]
    return []


def smoke_test(
    suite: Suite, difficulties: list[str], expert: Policy | None, agent: AgentConfig, sandbox: SandboxConfig,
    tokenizer: str = "auto",
) -> list[str]:  # fmt: skip
    """The whole smoke test (module docstring); returns warnings, raises RunCheckError."""
    tasks = sample_tasks(suite, difficulties)
    known = asyncio.run(_probe(suite, tasks))
    warnings = []
    below = [(t, ref, s) for t, ref, s in known if s < 1]
    if below:
        t, ref, s = below[0]
        warnings.append(
            f"warning: suite {type(suite).__name__}: right answers score below 1 at {len(below)} of {len(known)} "
            f"tasks tried, e.g. {t}: finish({ref!r}) scored {s:g}: is the verifier right?"
        )
    if expert is not None:
        warnings += expert_trees(suite, expert, tasks, agent, sandbox, tokenizer)
    return warnings


def check_run(cfg: RunConfig, synthesize: bool = True) -> list[str]:
    """Every check above for a configuration. The suite's tasks come from the run's data folder;
    when it has none yet, `synthesize` (`--check`: strict about task counts, and the smoke test of
    the scorer) writes them into a temporary folder (seconds for every shipped suite) that is
    removed after; else the synthesize stage checks them. Returns the warnings; raises RunCheckError."""
    import tempfile

    from rao_core.envs.suites import make_suite, open_suite

    suite = make_suite(cfg)
    check_expert(type(suite), cfg.policy, cfg.warmstart)
    warnings = unused_settings(type(suite), cfg.policy, cfg.warmstart)
    warnings += model_warnings(type(suite), cfg.policy, cfg.warmstart)

    def tasks_and_scorer(suite: Suite) -> list[str]:
        out = check_tasks(suite, cfg.rollout, cfg.eval, strict=synthesize)
        if synthesize:  # the expert without slips, on this suite object of the check's own
            suite.ctx = dataclasses.replace(suite.ctx, policy=ScriptedPolicy(error_rate=0.0))
            expert = suite.expert()
            expert = suite.demonstrator(cfg.warmstart) if expert is None else expert
            used = list(dict.fromkeys([*cfg.rollout.difficulty, *cfg.eval.difficulty]))
            out += smoke_test(suite, used, expert, cfg.agent, cfg.sandbox, cfg.policy.tokenizer)
        return out

    run_data = cfg.layout.data(cfg.suite)
    if all((run_data / f).is_file() for f in suite.files):
        warnings += tasks_and_scorer(open_suite(cfg, run_data))
    elif synthesize:
        with tempfile.TemporaryDirectory(prefix="rao-check-") as tmp:
            warnings += tasks_and_scorer(open_suite(cfg, Path(tmp)))
    return warnings
