"""Room on the Ray cluster for a shard, checked before the shards are sent.

Ray queues a task whose resources no node has and waits for ever (it logs a warning, an
autoscaler may add a node). A round whose shards ask for GPUs on a CPU cluster would hang. So
before the shards go out, a placement group of one shard's resources must become ready within
`rollout.placement_timeout_s`; otherwise the stage fails with one line naming what was asked and
what the cluster has.
"""

from __future__ import annotations


class PlacementError(RuntimeError):
    """No Ray node had room for a shard in time (`rao` prints it as one line)."""


def shard_resources(num_cpus: float, num_gpus: float) -> dict[str, float]:
    return {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}


def wait_for_room(num_cpus: float, num_gpus: float, timeout_s: float) -> None:
    """Return once some node of the connected Ray cluster can take one shard; raise
    PlacementError after `timeout_s` seconds otherwise."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    need = shard_resources(num_cpus, num_gpus)
    group = placement_group([need])
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        have = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        raise PlacementError(
            f"no Ray node had room for a shard ({_fmt(need)}: rollout.num_cpus_per_shard, "
            f"rollout.num_gpus_per_shard) within {timeout_s:g} s (rollout.placement_timeout_s); "
            f"the cluster has {_fmt(have) or 'no CPUs or GPUs'} in all, "
            f"on {len([n for n in ray.nodes() if n['Alive']])} nodes"
        ) from None
    finally:
        remove_placement_group(group)


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in resources.items())
