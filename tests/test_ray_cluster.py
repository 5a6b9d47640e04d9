"""Sharded rollouts and evaluations on a Ray cluster of several nodes, simulated on this machine
with `ray.cluster_utils.Cluster` (what Ray's docs recommend for testing failure handling): a head
that takes no tasks and 2 worker nodes of 1 CPU each, so 4 shards of 1 CPU must spread over both.
The flows join it by address, as `rollout.ray_address` joins a real cluster, and report to a
standing Prefect server (PREFECT_API_URL) from every node. The scripted toy keeps trees cheap.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import ray
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from rao_core.run import Run, load_config
from rao_core.stages.rollout import roll_out
from rao_core.store.parquet import read_meta, read_partition
from rao_core.tracking import Tracker
from tasks import stages
from tests.conftest import TOY
from tests.test_ray import check_round, shard_task_runs
from tests.test_sigkill import own_server_env

pytestmark = pytest.mark.slow  # a cluster of 3 raylets starts in about 15 s here

SHARDS = 4
CLUSTER_RUN = [*TOY, "agent.max_steps=6", "rollout.num_tasks=4", "rollout.group_size=2",
               f"rollout.shards={SHARDS}", "rollout.runner=ray", "eval.num_tasks=4", "eval.difficulty=medium",
               "campaign.rounds=1", "tracking.log_checkpoints=false", "eval.trees_to_render=0"]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    health = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 1000,
        "health_check_failure_threshold": 3,
    }
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": health},
    )
    for _ in range(2):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


def worker_ids(cluster) -> set[str]:
    return {n.node_id[:12] for n in cluster.worker_nodes}


def shard_nodes(part: Path) -> list[str]:
    """The Ray node of each shard of a sealed partition (its marker's `nodes`)."""
    return [name.rsplit("/", 1)[1] for name in read_meta(part)["nodes"]]


def test_rao_train_on_a_cluster_of_three_nodes(cluster, prefect_api, tmp_path):
    """`rao train` joined to the cluster: every stage's shards ran on both worker nodes, which
    the seal markers and MLflow record; the shards' task runs reported to the standing server;
    the round's trees are those of one unsharded local rollout."""
    ov = [f"runs_dir={tmp_path}", *CLUSTER_RUN, f"rollout.ray_address={cluster.address}"]
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "HF_HUB_OFFLINE": "1"}
    since = datetime.now(UTC)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "train", *(a for o in ov for a in ("--set", o))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    cfg = load_config(overrides=ov)
    for part in (cfg.layout.rollouts(0), cfg.layout.eval(0), cfg.layout.eval(1)):
        nodes = shard_nodes(part)
        assert len(nodes) == SHARDS and set(nodes) <= worker_ids(cluster) and len(set(nodes)) == 2, (
            part,
            nodes,
        )
    assert sorted(shard_task_runs(since)) == ["COMPLETED"] * SHARDS
    assert sorted(shard_task_runs(since, "evaluate")) == ["COMPLETED"] * 2 * SHARDS  # v0, v1
    tracker = Tracker.of(cfg)
    tags = MlflowClient(tracker.uri).get_run(tracker.round_run_id(0)).data.tags
    assert tags["rollout.nodes"] == ",".join(read_meta(cfg.layout.rollouts(0))["nodes"])

    rows = check_round(cfg, SHARDS)
    local = load_config(overrides=[f"runs_dir={tmp_path}", "run_name=local", *CLUSTER_RUN,
                                   "rollout.runner=local", "rollout.shards=1"])  # fmt: skip
    roll_out(Run(local), 0)
    assert {r["tree_id"] for r in rows} == {
        r["tree_id"] for r in read_partition(local.layout.rollouts(0), "nodes").to_pylist()
    }


def test_an_empty_address_starts_a_local_instance_beside_a_cluster(cluster, prefect_api, tmp_path):
    """rollout.ray_address='' starts a Ray instance of its own even where a cluster runs on the
    machine (Ray's ray.init() would join the latest `ray start` cluster, which
    ray.cluster_utils.Cluster also announces): its shards run on none of the cluster's nodes."""
    ov = [f"runs_dir={tmp_path}", *CLUSTER_RUN, "rollout.shards=2", "tracking.enabled=false"]
    env = {k: v for k, v in own_server_env(tmp_path).items() if k != "RAY_ADDRESS"}
    env["PREFECT_API_URL"] = prefect_api  # the module's standing server: no temporary one to start
    done = subprocess.run([sys.executable, "-m", "flows.cli", "rollout", *(a for o in ov for a in ("--set", o))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    nodes = set(shard_nodes(load_config(overrides=ov).layout.rollouts(0)))
    cluster_nodes = worker_ids(cluster) | {cluster.head_node.node_id[:12]}
    assert len(nodes) == 1 and not nodes & cluster_nodes, (nodes, cluster_nodes)


@task(name="rollout-shard", task_run_name="rollout-r{round_}-shard-{shard}", cache_policy=NO_CACHE)
def shard_on_a_lost_node(run: Run, round_: int, shard: int) -> str:
    """Shard 0's first attempt names its node, then waits there until the node is removed."""
    mark = Path(run.config.runs_dir) / "shard-0-first-node"
    if shard == 0 and not mark.exists():
        mark.write_text(ray.get_runtime_context().get_node_id())
        time.sleep(300)
        raise AssertionError("the node was not removed")
    return stages.rollout_shard.fn(run, round_, shard)


def test_a_node_lost_mid_round(cluster, prefect_api, tmp_path, monkeypatch):
    """A worker node removed while it runs a shard: Ray runs that shard again on the node left,
    and the round holds every tree once. (The head checks its nodes every second here, so a lost
    node is noticed in about 3 s rather than Ray's default 30.)"""
    from flows.training import rollout_flow

    monkeypatch.setattr(stages, "rollout_shard", shard_on_a_lost_node)  # what the flow maps over Ray
    ov = [f"runs_dir={tmp_path}", *CLUSTER_RUN, f"rollout.ray_address={cluster.address}"]
    mark, removed = tmp_path / "shard-0-first-node", []

    def remove_that_node() -> None:
        while not mark.is_file() or not mark.read_text():
            time.sleep(0.2)
        node = next(n for n in cluster.worker_nodes if n.node_id == mark.read_text())
        cluster.remove_node(node, allow_graceful=False)
        removed.append(node.node_id[:12])

    remover = threading.Thread(target=remove_that_node, daemon=True)
    remover.start()
    since = datetime.now(UTC)
    try:
        rollout_flow(overrides=ov)
    finally:
        remover.join(timeout=1)
        while len(cluster.worker_nodes) < 2:  # the next test's cluster has 2 worker nodes again
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    cfg = load_config(overrides=ov)
    nodes = shard_nodes(cfg.layout.rollouts(0))
    assert removed and nodes[0] != removed[0] and set(nodes) <= worker_ids(cluster) | set(removed)
    assert sorted(shard_task_runs(since)) == ["COMPLETED"] * SHARDS  # Ray re-ran the same task run
    check_round(cfg, SHARDS)


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_a_shard_the_cluster_has_no_room_for_fails_in_one_line(cluster, prefect_api, tmp_path, command):
    """Shards that ask for a GPU on a cluster without one: one line within the placement
    timeout, never a hang."""
    ov = [f"runs_dir={tmp_path}", *CLUSTER_RUN, f"rollout.ray_address={cluster.address}",
          "rollout.num_gpus_per_shard=1", "rollout.placement_timeout_s=5"]  # fmt: skip
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "flows.cli", command, *(a for o in ov for a in ("--set", o))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("error: no Ray node had room for a shard (1 CPU, 1 GPU") and "within 5 s" in last
    ), last
