"""Deployments: register the flows with a Prefect server so runs can be triggered and scheduled
from the UI. `rao serve` calls this; stop it with Ctrl-C (schedules stay active)."""

from __future__ import annotations

from datetime import timedelta

from prefect import serve

from flows.training import evaluate_flow, rollout_flow, round_flow, synthesize_flow, train_flow


def deployments(config: str | None, overrides: list[str], interval_minutes: float | None):
    params = {"config": config, "overrides": overrides}
    every = timedelta(minutes=interval_minutes) if interval_minutes else None
    return [
        train_flow.to_deployment(name="train", parameters=params, concurrency_limit=1),
        # one round at a time: a scheduled round that outlasts the interval makes the next one wait
        round_flow.to_deployment(name="next-round", parameters=params, interval=every, concurrency_limit=1),
        evaluate_flow.to_deployment(name="evaluate", parameters=params),
        evaluate_flow.to_deployment(name="compare", parameters={**params, "compare": True}),
        rollout_flow.to_deployment(name="rollout", parameters=params),
        synthesize_flow.to_deployment(name="synthesize", parameters=params),
    ]


def serve_all(config: str | None, overrides: list[str], interval_minutes: float | None) -> None:
    serve(*deployments(config, overrides, interval_minutes), pause_on_shutdown=False)
