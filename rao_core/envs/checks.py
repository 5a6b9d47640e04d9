"""What `rao train --check` (and every run, before its first stage's work) can see of the suite
that plain value checks cannot: whether it has the scripted expert a setting needs, whether its
task rows carry the labels it declares and hold enough tasks for the draws, and which settings do
nothing for it. Each refusal is one line naming the key (docs/own-task.md, "Checked before any work").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rao_core.config import EvalConfig, PolicyConfig, RolloutConfig, RunConfig, WarmStartConfig
from rao_core.envs.base import SUITE_SPECIFIC, Suite


class RunCheckError(ValueError):
    """A run that would fail later, refused now: one line naming the key."""


def has_expert(cls: type[Suite]) -> bool:
    """Does the suite write a scripted expert (its own `expert()` or `demonstrator()`)?"""
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
    if policy.model == "warmstart" and not demos and not has_expert(cls):
        raise RunCheckError(
            f"policy.model: 'warmstart': {name} has no scripted expert to learn from; set "
            "warmstart.demonstrations (a Parquet file or folder of trees) or write expert() (docs/own-task.md)"
        )


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


def check_run(cfg: RunConfig, synthesize: bool = True) -> list[str]:
    """Every check above for a configuration. The suite's tasks come from the run's data folder;
    when it has none yet, `synthesize` (`--check`: strict about task counts too) writes them into a
    temporary folder (seconds for every shipped suite) that is removed after; else the synthesize
    stage checks them. Returns the warnings; raises RunCheckError."""
    import tempfile

    from rao_core.envs.suites import make_suite, open_suite

    suite = make_suite(cfg)
    check_expert(type(suite), cfg.policy, cfg.warmstart)
    warnings = unused_settings(type(suite), cfg.policy, cfg.warmstart)
    run_data = cfg.layout.data(cfg.suite)
    if all((run_data / f).is_file() for f in suite.files):
        warnings += check_tasks(open_suite(cfg, run_data), cfg.rollout, cfg.eval, strict=synthesize)
    elif synthesize:
        with tempfile.TemporaryDirectory(prefix="rao-check-") as tmp:
            warnings += check_tasks(open_suite(cfg, Path(tmp)), cfg.rollout, cfg.eval)
    return warnings
