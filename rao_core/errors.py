"""Failures of the machine, not of the policy.

An engine that runs out of memory or whose server is gone, a REPL worker that cannot start, a
judge that cannot be reached, a suite scorer that raises: none of these says anything about the
policy's actions. A node that meets one ends with status `infra_error` (after retries), its tree is
marked `infra_error` and dropped from its group like a timed-out tree, and the round counts them.
Policy failures (bad cells, loops, context overflow, a cell that crashes its REPL) stay policy
failures.
"""

from __future__ import annotations

from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential


class InfrastructureError(RuntimeError):
    """A component failed to serve; `kind` names which (engine, sandbox, judge, scorer, internal)."""

    kind = "internal"

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind or self.kind


class EngineError(InfrastructureError):
    kind = "engine"


class SandboxStartError(InfrastructureError):
    kind = "sandbox"


class JudgeError(InfrastructureError):
    kind = "judge"


def is_scorer_failure(status: str, finish_message: str) -> bool:
    """Did the node end because its suite's scorer broke the reward contract (envs/base.py
    ScorerError)? Such a node is an infra_error whose message starts with the kind, `scorer:`."""
    return status == "infra_error" and finish_message.startswith("scorer:")


def scorer_is_broken(failed: int, nodes: int) -> bool:
    """A scorer that failed at half the nodes or more says nothing about the policy: a campaign
    stops on such a partition (campaign.py) and a warm start refuses such expert trees."""
    return failed > 0 and 2 * failed >= nodes


def retrying(attempts: int) -> AsyncRetrying:
    """Retry a component call that raised, with exponential backoff (0.5 s, 1 s, 2 s, ... up to 8 s),
    re-raising the last error: `await retrying(3)(fn, *args)`. Only Exceptions are retried, so a
    cancelled node never is (CancelledError is a BaseException)."""
    return AsyncRetrying(
        stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=0.5, max=8.0), reraise=True
    )
