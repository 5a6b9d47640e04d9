"""A training campaign: its arms, the stages of each round, and where a run stands.

    warm start -> checkpoint v0 -> evaluate v0
    round r:  rollout (v_r) -> score -> train (v_r -> v_r+1) -> evaluate (v_r+1) -> log

Every stage writes a file-based output marked complete and returns at once when it finds one, so a
killed campaign started again continues from the last completed stage, and a finished one does
nothing. Prefect (flows/, tasks/) only chains these functions; MLflow records them
(tracking.py); reporting.py says what they did. Paths: rao_core/layout.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rao_core import tracking
from rao_core.checkpoints import initial_model as _initial_model
from rao_core.config import RunConfig
from rao_core.engines.scope import EngineScope, engine_scope, make_room_for_training
from rao_core.runlock import note_stage


def round_config(cfg: RunConfig, round_: int) -> RunConfig:
    """The run's configuration with the round and policy version of round `round_`."""
    rollout = dataclasses.replace(cfg.rollout, round=round_, policy_version=round_)
    return dataclasses.replace(cfg, rollout=rollout)


def control_config(cfg: RunConfig) -> RunConfig:
    """The single-agent control arm of a campaign: same model, tasks, budgets and rounds, in the
    run `<run_name>-single`, with no launch_subagent, w = 1 and lambda 0 (the plain group baseline
    of the standard agent-RL recipe), and `campaign.control_tasks` root tasks a round if set.
    A warm start trained by the main arm is shared, not redone."""
    policy = cfg.policy
    if policy.model == "warmstart":
        policy = dataclasses.replace(policy, model=str(initial_model(cfg)))
    return dataclasses.replace(
        cfg,
        run_name=f"{cfg.run_name}-single",
        agent=dataclasses.replace(cfg.agent, mode="single"),
        scoring=dataclasses.replace(cfg.scoring, lam=0.0, depth_weighting=False),
        campaign=dataclasses.replace(cfg.campaign, control_arm=False),
        policy=policy,
        rollout=dataclasses.replace(
            cfg.rollout, num_tasks=cfg.campaign.control_tasks or cfg.rollout.num_tasks
        ),
    )


def arms(cfg: RunConfig) -> list[RunConfig]:
    """The campaign's arms: the run itself, and its single-agent control arm when asked for."""
    return [cfg, control_config(cfg)] if cfg.campaign.control_arm else [cfg]


@contextlib.contextmanager
def engines(cfg: RunConfig) -> Iterator[EngineScope]:
    """The scope of a campaign's engines: one vLLM server per setting for all its stages, its log
    in <run>/logs/, holding the largest context any stage asks for (`rao eval --compare` may ask
    for more than the agent's), stopped when the scope ends (rao_core/engines/scope.py). The hf
    engine's child processes start at once, so their imports overlap the stages before the first
    rollout or evaluation."""
    with engine_scope(
        cfg.layout.logs, max([cfg.agent.max_context_tokens, *cfg.eval.context_limits])
    ) as scope:
        if cfg.policy.kind == "hf":
            from rao_core.engines.hf_process import start_processes
            from rao_core.rollout import engine_config

            start_processes(engine_config(cfg))
        yield scope


def initial_model(cfg: RunConfig) -> Path:
    """Policy version 0: a shipped checkpoint, a local folder, a cached hub id, or the run's own
    warm start."""
    return _initial_model(cfg.policy.model, cfg.run_dir)


def model_path(cfg: RunConfig, version: int) -> Path:
    """The checkpoint of policy version `version`."""
    return initial_model(cfg) if version == 0 else cfg.layout.checkpoint(version)


# -- stages ------------------------------------------------------------------------------------
def stage_warm_start(cfg: RunConfig, progress: bool = False) -> Path:
    """Version 0 exists after this: shipped, given, or trained here once with `warmstart.*`
    (the stage's folder is <run>/checkpoints/warmstart/, its checkpoint the `model` folder in it)."""
    path = initial_model(cfg)
    note_stage(cfg.run_dir, "warm start")
    if cfg.policy.model == "warmstart" and not cfg.layout.warmstart_complete():
        from rao_core.envs.suites import open_suite
        from rao_core.train.warmstart import warm_start

        warm_start(cfg.warmstart, cfg.layout.warmstart, open_suite(cfg), progress=progress)
    return path


def stage_rollout(cfg: RunConfig, round_: int, progress: bool = False) -> Path:
    from rao_core.rollout import rollout_round

    note_stage(cfg.run_dir, f"rollout of round {round_}")
    return rollout_round(round_config(cfg, round_), progress, model_path(cfg, round_))


def stage_score(cfg: RunConfig, round_: int) -> Path:
    from rao_core.scoring import score_round

    note_stage(cfg.run_dir, f"scoring of round {round_}")
    return score_round(cfg.run_dir, round_, cfg.scoring)


def round_lr(cfg: RunConfig, round_: int) -> float:
    """The learning rate of round `round_`: linear from train.lr at round 0 to train.lr * lr_final
    at the campaign's last round; rounds added later keep the last value."""
    last = max(1, cfg.campaign.rounds - 1)
    return cfg.train.lr * (1 + (cfg.train.lr_final - 1) * min(round_, last) / last)


def stage_train(cfg: RunConfig, round_: int) -> dict[str, Any]:
    """In the flow's process, or as `accelerate launch` on N processes when train.accelerate_config is set."""
    from rao_core.train.stage import launch_round, train_round

    note_stage(cfg.run_dir, f"training of round {round_}")
    paths = (cfg.run_dir, round_, model_path(cfg, round_), cfg.layout.checkpoint(round_ + 1))
    train = dataclasses.replace(cfg.train, lr=round_lr(cfg, round_))
    tokenizer = None if cfg.policy.tokenizer == "auto" else cfg.policy.tokenizer
    with make_room_for_training():  # vLLM sleeps (or stops) while the trainer runs
        if cfg.train.accelerate_config:
            return launch_round(cfg.train.accelerate_config, *paths, train, initial_model(cfg), tokenizer)
        return train_round(*paths, train, initial_model(cfg), tokenizer)


def stage_evaluate(cfg: RunConfig, version: int, progress: bool = False) -> dict[str, Any]:
    from rao_core.eval.evaluate import evaluate_round

    note_stage(cfg.run_dir, f"evaluation of version {version}")
    return evaluate_round(round_config(cfg, version), version, model_path(cfg, version), progress)


# -- where a run stands ------------------------------------------------------------------------
def completed_rounds(cfg: RunConfig) -> int:
    """Rounds whose evaluation of the new policy is complete (the next round to run)."""
    return cfg.layout.completed_rounds()


def status(cfg: RunConfig, rounds: int | None = None) -> list[dict[str, Any]]:
    """Per round: which stages have complete outputs."""
    rounds = rounds if rounds is not None else max(cfg.campaign.rounds, completed_rounds(cfg))
    run = cfg.layout
    return [
        {
            "round": r,
            "rollout": run.complete(run.rollouts(r)),
            "score": run.complete(run.scores(r)),
            "train": run.checkpoint_complete(r + 1),
            "eval": run.complete(run.eval(r + 1)),
            "logged": run.logged(r).is_file(),
        }
        for r in range(rounds)
    ]


def prepare(cfg: RunConfig) -> dict[str, Any]:
    """Before a stage runs: refuse a configuration that would alter completed stages of this run
    folder, then save it (and record any allowed change with the first round it applies to)."""
    from rao_core import resume

    cfg.layout.migrate()  # a run folder of the old naming (rao_core/layout.py)
    diff = resume.check_resume(cfg)
    first = completed_rounds(cfg)
    resume.record(cfg, diff, first)
    if diff:  # also on the campaign's MLflow run, next to the metrics it explains
        changes = json.dumps({k: list(v) for k, v in diff.items()}, default=str)
        tracking.set_tag(cfg, tracking.campaign_run_id(cfg), f"config_change.round_{first}", changes)
    return diff


class CampaignStopped(RuntimeError):
    """The campaign stopped early, for the reason in the message (not a failure of any stage)."""


def hopeless_start(cfg: RunConfig) -> str | None:
    """After round 0 is scored: when v0 solved no held-out task and no group of round 0 has spread,
    RL has no signal to learn from and more rounds would spend hours doing nothing. Returns what
    to try instead, or None (also with scoring.zero_advantage_groups=keep: train them anyway)."""
    from rao_core.eval.evaluate import summarize_eval
    from rao_core.scoring import no_signal, scores_summary

    run = cfg.layout
    if cfg.scoring.zero_advantage_groups == "keep":  # asked to train such groups anyway
        return None
    if not (run.complete(run.eval(0)) and run.complete(run.scores(0))):
        return None
    v0 = summarize_eval(run.eval(0)).get("all", {}).get("success")
    why = no_signal(scores_summary(cfg.run_dir, 0)["groups"])
    if v0 != 0 or why is None:
        return None
    return (
        f"{cfg.run_name}: stopped after round 0: v0 solves 0% of the held-out tasks and {why}, so RL has "
        "nothing to learn from. Try: a warm start (policy.model=warmstart, from the suite's expert or "
        "warmstart.demonstrations), easier tasks (rollout.difficulty), more trees per task "
        "(rollout.group_size) or a higher policy.temperature, and budgets that fit the task "
        "(agent.max_new_tokens, agent.max_steps: docs/own-task.md, 'Sizing your task')"
    )
