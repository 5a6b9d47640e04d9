"""Deployments: register the flows with a Prefect server so runs can be triggered and scheduled
from the UI. `rao serve` serves them from its own process; stop it with Ctrl-C or SIGTERM (the
flow runs in flight are cancelled; schedules stay as they are: docs/pipeline.md, "Schedules").
`rao deploy --pool NAME` registers them on a process work pool instead, for the workers that
`prefect worker start --pool NAME` runs on any machine with this project installed
(docs/scale-out.md, "Prefect workers")."""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta

from prefect.deployments.runner import EntrypointType
from prefect.runner import Runner
from prefect.schedules import Interval

from flows.training import evaluate_flow, rollout_flow, round_flow, synthesize_flow, train_flow
from rao_core import interrupts

SCHEDULED = "rao-round/next-round"


def schedule_paused(name: str = SCHEDULED) -> bool:
    """Is the deployment paused, or all its schedules, on the server (from the UI or the CLI)?
    False when it does not exist yet."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async def read() -> bool:
        async with get_client() as client:
            try:
                d = await client.read_deployment_by_name(name)
            except ObjectNotFound:
                return False
            return bool(d.paused) or bool(d.schedules) and not any(s.active for s in d.schedules)

    return asyncio.run(read())


def deployments(
    config: str | None,
    overrides: list[str],
    interval_minutes: float | None,
    paused: bool = False,
    by_module: bool = False,
):
    """The six deployments; `paused` keeps the next-round schedule paused (a schedule paused in
    the UI stays paused when `rao serve` starts again). `by_module` names each flow by its module
    (`flows.training.train_flow`), which a worker imports from the installed project, rather than
    by a file path on this machine."""
    params = {"config": config, "overrides": overrides}
    every = [Interval(timedelta(minutes=interval_minutes), active=not paused)] if interval_minutes else None
    kind = {"entrypoint_type": EntrypointType.MODULE_PATH} if by_module else {}
    return [
        train_flow.to_deployment(name="train", parameters=params, concurrency_limit=1, **kind),
        # one round at a time: a scheduled round that outlasts the interval makes the next one wait
        round_flow.to_deployment(
            name="next-round", parameters=params, schedules=every, concurrency_limit=1, **kind
        ),
        evaluate_flow.to_deployment(name="evaluate", parameters=params, **kind),
        evaluate_flow.to_deployment(name="compare", parameters={**params, "compare": True}, **kind),
        rollout_flow.to_deployment(name="rollout", parameters=params, **kind),
        synthesize_flow.to_deployment(name="synthesize", parameters=params, **kind),
    ]


def deploy_to_pool(
    pool: str, config: str | None, overrides: list[str], interval_minutes: float | None
) -> list[str]:
    """Register the six deployments on the process work pool `pool` (created if missing); returns
    their names. The runs go to whichever worker of the pool polls first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            found = client.read_work_pool(pool)
        except ObjectNotFound:
            found = client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        if found.type != "process":
            raise ValueError(f"--pool {pool}: a {found.type} work pool; rao deploys to process pools")
    names = []
    for deployment in deployments(config, overrides, interval_minutes, schedule_paused(), by_module=True):
        deployment.apply(work_pool_name=pool)
        names.append(f"{deployment.flow_name}/{deployment.name}")
    return names


def serve_all(config: str | None, overrides: list[str], interval_minutes: float | None) -> None:
    paused = schedule_paused()
    if paused:
        print(f"{SCHEDULED}: its schedule is paused and stays paused; resume it in the UI or with "
              f"`prefect deployment schedule resume {SCHEDULED} <id from: prefect deployment schedule ls "
              f"{SCHEDULED}>` (docs/pipeline.md)")  # fmt: skip
    runner = Runner(pause_on_shutdown=False)
    for deployment in deployments(config, overrides, interval_minutes, paused):
        runner.add_deployment(deployment)

    def stop(signum: int, frame: object) -> None:
        # Prefect's own way out (its SIGTERM handler: cancel the flow runs in flight, end the
        # polling), for SIGINT too: asyncio's Ctrl-C could leave the runner waiting for ever.
        # rao's grace timer and second signal end it at once if that clean-up hangs.
        interrupts.count(signum)
        runner.handle_sigterm()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    asyncio.run(runner.start())
