"""A training campaign: the engines its stages share, where a run stands, and when to stop.

    warm start -> checkpoint v0 -> evaluate v0
    round r:  rollout (v_r) -> score -> train (v_r -> v_r+1) -> evaluate (v_r+1) -> report

With campaign.max_staleness = k >= 1 the rollouts and evaluations run in a lane of their own beside
the trainer, round r sampling with v_max(0, r-k) (below, "overlapping rounds").

The stages themselves sit side by side in rao_core/stages/; every one writes a file-based output
marked complete and returns at once when it finds one, so a killed campaign started again continues
from the last completed stage, and a finished one does nothing. Prefect (flows/, tasks/) chains
them; MLflow records them (tracking.py). Paths: rao_core/layout.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rao_core import interrupts
from rao_core.config import ConfigError, PolicyConfig, TrainConfig
from rao_core.engines.open import start_policy_processes
from rao_core.engines.scope import EngineScope, engine_scope
from rao_core.errors import scorer_is_broken
from rao_core.eval.metrics import load_round, scorer_failures, summarize, summarize_eval
from rao_core.run import Run
from rao_core.scoring import no_signal, scores_summary
from rao_core.store.parquet import set_aside


@contextlib.contextmanager
def engines(run: Run) -> Iterator[EngineScope]:
    """The scope of a campaign's engines: one vLLM server per setting for all its stages, its log
    in <run>/logs/, holding the largest context any stage asks for (`rao eval --compare` may ask
    for more than the agent's), stopped when the scope ends (rao_core/engines/scope.py). The hf
    engine's child processes start at once, so their imports overlap the stages before the first
    rollout or evaluation."""
    cfg = run.config
    with engine_scope(
        run.layout.logs, max([cfg.agent.max_context_tokens, *cfg.eval.context_limits])
    ) as scope:
        start_policy_processes(cfg.policy, cfg.rollout.runner == "ray", cfg.campaign.max_staleness > 0)
        yield scope


# -- where a run stands ------------------------------------------------------------------------
def status(run: Run, rounds: int | None = None) -> list[dict[str, Any]]:
    """Per round: which stages have complete outputs."""
    rounds = rounds if rounds is not None else max(run.config.campaign.rounds, run.layout.completed_rounds())
    layout = run.layout
    return [
        {
            "round": r,
            "rollout": layout.complete(layout.rollouts(r)),
            "score": layout.complete(layout.scores(r)),
            "train": layout.checkpoint_complete(r + 1),
            "eval": layout.complete(layout.eval(r + 1)),
            "logged": layout.logged(r).is_file(),
        }
        for r in range(rounds)
    ]


# what a node's end says, for the stop message of a campaign that learns nothing
ENDED = {
    "finished": "answered, scored 0",
    "budget": "out of agent.max_steps",
    "loop": "the same cell again and again",
    "context_overflow": "out of agent.max_context_tokens",
    "error": "its cell crashed the REPL",
    "timeout": "a cell or the tree ran out of time",
}


class CampaignStopped(RuntimeError):
    """The campaign stopped early, for the reason in the message (not a failure of any stage)."""


def hopeless_start(run: Run) -> str | None:
    """After round 0 is scored: when v0 solved no held-out task and no group of round 0 has spread,
    RL has no signal to learn from and more rounds would spend hours doing nothing. Returns what
    to try instead, or None (also with scoring.zero_advantage_groups=keep: train them anyway)."""
    layout = run.layout
    if run.config.scoring.zero_advantage_groups == "keep":  # asked to train such groups anyway
        return None
    if not (layout.complete(layout.eval(0)) and layout.complete(layout.scores(0))):
        return None
    v0 = summarize_eval(layout.eval(0)).get("all", {}).get("success")
    why = no_signal(scores_summary(run.dir, 0)["groups"])
    if v0 != 0 or why is None:
        return None
    ended = summarize(load_round(layout, 0))["statuses"]  # a loop, an overflow: the model's habits
    how = ", ".join(
        f"{k} {v}" + (f" ({ENDED[k]})" if k in ENDED else "")
        for k, v in sorted(ended.items(), key=lambda kv: -kv[1])
    )
    return (
        f"{run.name}: stopped after round 0: v0 solves 0% of the held-out tasks and {why}, so RL has "
        f"nothing to learn from. Round 0's {sum(ended.values())} nodes ended: {how}. "
        "Try: a warm start (policy.model=warmstart, from the suite's expert, a dataset's "
        "warmstart.demonstrator or warmstart.demonstrations), easier tasks (rollout.difficulty), more trees per task "
        "(rollout.group_size) or a higher policy.temperature, and budgets that fit the task "
        "(agent.max_new_tokens, agent.max_steps: docs/own-task.md, 'Sizing your task')"
    )


def broken_scorer(run: Run, round_: int) -> str | None:
    """After round r's rollout: when the suite's scorer (success(), a verifier, a judge) failed at
    half or more of the nodes of the round, or of the evaluation of version r, the rewards say
    nothing about the policy. Those partitions are set aside (sampled again once the scorer is
    fixed), and the scorer's message is returned; else None."""
    return _set_aside_broken(run, [round_], rollout=round_)


def broken_evaluation(run: Run, version: int) -> str | None:
    """`broken_scorer` for version `version`'s evaluation alone: when rounds overlap, the engine
    lane checks each evaluation as it ends (the trainer may have passed that round already)."""
    return _set_aside_broken(run, [version])


def _set_aside_broken(run: Run, versions: list[int], rollout: int | None = None) -> str | None:
    """Set aside the evaluations of `versions` and round `rollout`'s rollout where the scorer
    failed at half or more of the nodes; the message of the last, or None."""
    layout, lines = run.layout, []
    partitions = [(f"the evaluation of v{v}", layout.eval(v), v) for v in versions]
    if rollout is not None:
        partitions.append((f"round {rollout}", layout.rollouts(rollout), None))
    for what, dest, version in partitions:
        if not layout.complete(dest):
            continue
        failed, nodes, first = scorer_failures(dest)
        if scorer_is_broken(failed, nodes):
            lines.append((what, failed, nodes, first, set_aside(dest, "scorer-failed").name))
            if version == 0:  # MLflow's v0 is logged again, from the new evaluation
                layout.logged_baseline.unlink(missing_ok=True)
            elif version is not None:  # and the round that made this version, with it
                layout.logged(version - 1).unlink(missing_ok=True)
    if not lines:
        return None
    what, failed, nodes, first, _ = lines[-1]
    aside = ", ".join(f"{w} as {a}" for w, *_, a in lines)
    return (
        f"{run.name}: stopped: the suite's scorer failed at {failed} of {nodes} nodes of {what}, as at "
        f"{first}. A bug of the scorer, not of the policy: fix it and run the same command again "
        f"(set aside to be sampled again: {aside}; `rao train --check` scores the suite's tasks first)"
    )


# -- overlapping rounds (campaign.max_staleness = k >= 1, docs/overlap.md) ----------------------
# Two lanes run side by side: the engine lane (every rollout and every new version's evaluation:
# everything that samples, on the one set of engines) and the trainer (scoring, training, reports).
# Round r samples with version max(0, r - k), so the rollout of round r + 1 runs while round r
# trains. Which version a round samples with depends on k alone, never on timing: a killed run
# resumed, or run again, samples the same trees.
@dataclass(frozen=True)
class EngineJob:
    """A job of the engine lane: round `index`'s rollout, or version `index`'s evaluation; it
    waits for checkpoint `needs`, the version it samples with."""

    kind: str  # "rollout" | "evaluate"
    index: int
    needs: int


def engine_jobs(first: int, rounds: int, k: int) -> list[EngineJob]:
    """The engine lane's work for rounds first..rounds-1, in the order it runs it: each job as soon
    as the version it samples with exists, an evaluation before a rollout that waited for the same
    version (the report of that round needs it; the rollout is needed only a round later)."""
    jobs = [EngineJob("rollout", r, max(0, r - k)) for r in range(first, rounds)]
    jobs += [EngineJob("evaluate", v, v) for v in range(first + 1, rounds + 1)]
    return sorted(jobs, key=lambda j: (j.needs, j.kind != "evaluate", j.index))


class LaneStopped(RuntimeError):
    """The other lane failed, or the campaign stops: this lane ends too."""


def wait_until(
    ready: Callable[[], bool], what: str, timeout_s: float, stopped: Callable[[], str | None],
    poll_s: float = 0.2,
) -> None:  # fmt: skip
    """Wait for the other lane's output: until `ready()`, or raise LaneStopped when `stopped()`
    says why the other lane ended, or TimeoutError after `timeout_s` (campaign.wait_timeout_s)
    instead of hanging."""
    deadline = time.monotonic() + timeout_s
    while True:
        interrupts.check()  # a signal ends the waiting lane, whatever became of the other
        if why := stopped():  # first: a lane told to stop starts nothing more
            raise LaneStopped(f"stopped waiting for {what}: {why}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"waited {timeout_s:g} s for {what} (campaign.wait_timeout_s): the other lane is stuck"
            )
        time.sleep(poll_s)


@dataclass
class LaneState:
    """What the trainer and the engine lane share: the trainer's stop, why the lane ended, and
    the campaign stop the lane decided (a broken scorer in an evaluation)."""

    stop: threading.Event = field(default_factory=threading.Event)
    error: list[str] = field(default_factory=list)
    campaign_stop: list[str] = field(default_factory=list)

    def ended(self, done: Callable[[], bool]) -> Callable[[], str | None]:
        """For the trainer's waits: why the lane ended (its error, or `done()` without one, a
        lane that died before its first line), or None while it runs."""

        def why() -> str | None:
            if self.error:
                return self.error[0]
            return "the engine lane ended" if done() else None

        return why

    def stopped(self) -> str | None:
        return "the campaign stops" if self.stop.is_set() else None


def checkpoint_ready(run: Run, version: int) -> bool:
    """Version `version` can be sampled with (0: the warm start, done before the rounds)."""
    return version == 0 or run.layout.checkpoint_complete(version)


def check_overlap(policy: PolicyConfig, train: TrainConfig, k: int) -> None:
    """Refuse, in one line, rounds that overlap (campaign.max_staleness >= 1) with a vLLM server
    that sleeps or stops while the trainer runs on its device: the engine lane samples meanwhile,
    so the two would fight for the device. 'auto' devices are the first GPU, or the CPU."""
    p, t = policy, train
    if not k or p.kind != "vllm":
        return
    from rao_core.engines.vllm_args import during_train, on_gpu  # torch-free

    gpu = on_gpu(p)

    def where(device: str) -> str:
        return ("cuda:0" if gpu else "cpu") if device == "auto" else "cuda:0" if device == "cuda" else device

    if during_train(p) != "keep" and where(p.device) == where(t.device):
        raise ConfigError(
            f"campaign.max_staleness: {k}: rounds that overlap keep the vLLM server sampling while the "
            f"trainer runs, but policy.vllm_during_train={p.vllm_during_train} makes it {during_train(p)} "
            f"on the trainer's device ({where(t.device)}): put them on different GPUs "
            "(policy.device=cuda:1, train.device=cuda:0) or set policy.vllm_during_train=keep"
        )
