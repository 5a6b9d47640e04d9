"""Sharded rollouts on Ray through Prefect's Ray task runner.

A local Ray instance with 2 CPUs stands in for a cluster (one for the module: Ray starts in about
7 s here); the flows find it initialised and use it. The scripted expert keeps the trees cheap: the
point is the plumbing (one task run and one partition per shard, all shards read as one table,
retries after a lost worker), not the policy.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from rao_core.config import ConfigError, RunConfig
from rao_core.eval.metrics import load_round
from rao_core.run import Run, load_config
from rao_core.sampler import shard_tasks
from rao_core.scoring import score_nodes, score_round
from rao_core.stages.evaluate import evaluate, evaluate_shard
from rao_core.stages.rollout import roll_out, roll_out_shard
from rao_core.store.db import connect
from rao_core.store.parquet import is_complete, read_meta, read_partition
from tasks import stages
from tests.conftest import TOY

TASKS, G = 4, 2
SHARDED = [
    *TOY,
    f"rollout.num_tasks={TASKS}",
    f"rollout.group_size={G}",
    "rollout.shards=2",
    "rollout.runner=ray",
    "policy.error_rate=0.3",  # mixed successes: scores that depend on the row order
]


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def sharded_config(tmp_path: Path, *extra: str) -> tuple[list[str], RunConfig]:
    overrides = [f"runs_dir={tmp_path}", *SHARDED, *extra]
    return overrides, load_config(overrides=overrides)


def test_shard_tasks_deals_every_task_once():
    assert shard_tasks(list(range(7)), 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert shard_tasks(["a"], 1) == [["a"]]
    with pytest.raises(ConfigError, match=r"rollout.shards: 3: must be <= rollout.num_tasks \(2\)"):
        load_config(overrides=[*TOY, "rollout.num_tasks=2", "rollout.shards=3"])


def test_local_shards_resume_then_seal(tmp_path):
    """Without Ray the shards run in turn: a round with one shard done is invisible to readers,
    the next attempt runs only the missing shard, and the sealed round reads as one table."""
    cfg = load_config(
        overrides=[f"runs_dir={tmp_path}", *TOY, f"rollout.num_tasks={TASKS}", "rollout.shards=2"]
    )
    first = roll_out_shard(Run(cfg), 0, 0)
    stamp = (first / "nodes.parquet").stat().st_mtime_ns
    assert first == cfg.layout.rollouts(0) / "shard=0" and not is_complete(cfg.layout.rollouts(0))
    with connect(cfg.run_dir) as con:
        assert con.sql("SELECT count(*) FROM nodes").fetchall() == [(0,)]
    assert roll_out(Run(cfg), 0) == cfg.layout.rollouts(0)
    assert (first / "nodes.parquet").stat().st_mtime_ns == stamp  # shard 0 was not rolled out again
    meta = read_meta(cfg.layout.rollouts(0))
    shard_rows = [read_meta(cfg.layout.rollouts(0) / p)["rows"]["nodes"] for p in meta["parts"]]
    assert meta["rows"]["nodes"] == sum(shard_rows) == load_round(cfg.layout, 0).num_rows
    assert meta["trees"] == TASKS * 2  # TOY's G = 2


def test_a_round_is_finished_with_the_shard_count_it_started_with(tmp_path):
    cfg = load_config(
        overrides=[f"runs_dir={tmp_path}", *TOY, f"rollout.num_tasks={TASKS}", "rollout.shards=2"]
    )
    roll_out_shard(Run(cfg), 0, 0)
    other = load_config(
        overrides=[f"runs_dir={tmp_path}", *TOY, f"rollout.num_tasks={TASKS}", "rollout.shards=3"]
    )
    with pytest.raises(
        ValueError, match="round 0 was started with 2 shards; finish it with rollout.shards=2"
    ):
        roll_out(Run(other), 0)


def shard_task_runs(since: datetime, stage: str = "rollout") -> list[str]:
    """States of the `stage` shard task runs (`rollout-r0-shard-1`) that started after `since`."""
    from prefect.client.orchestration import get_client

    async def read():
        async with get_client() as client:
            return await client.read_task_runs()

    runs = asyncio.run(read())
    named = re.compile(rf"{stage}-[rv]\d+-shard-\d+")
    return [r.state.type.value for r in runs if named.fullmatch(r.name) and r.start_time >= since]


def check_round(cfg: RunConfig, shards: int = 2) -> list[dict]:
    """The sealed round: every shard listed and complete, each root task in one shard only, G
    trees per task, no node twice; the DuckDB view and read_partition agree."""
    dest = cfg.layout.rollouts(0)
    parts = [f"shard={k}" for k in range(shards)]
    assert read_meta(dest)["parts"] == parts
    task_sets = []
    for part in parts:
        assert is_complete(dest / part)
        table = pq.read_table(dest / part / "nodes.parquet", columns=["task_id"])
        task_sets.append(set(table.column("task_id").to_pylist()))
    assert all(task_sets) and sum(map(len, task_sets)) == len(set().union(*task_sets))
    rows = load_round(cfg.layout, 0).to_pylist()
    assert len([r for r in rows if r["parent_id"] is None]) == cfg.rollout.num_tasks * cfg.rollout.group_size
    ids = [r["node_id"] for r in rows]
    assert len(ids) == len(set(ids))
    with connect(cfg.run_dir) as con:
        assert con.sql("SELECT count(*), count(DISTINCT node_id) FROM nodes").fetchall() == [(len(ids),) * 2]
    assert not list(dest.glob(".tmp-*")) and not list(dest.glob(".trash-*"))
    return rows


@pytest.mark.slow
def test_sharded_rollout_on_ray_matches_one_local_rollout(ray_cluster, prefect_server, tmp_path):
    from flows.training import rollout_flow

    overrides, cfg = sharded_config(tmp_path)
    since = datetime.now(UTC)
    assert Path(rollout_flow(overrides=overrides)) == cfg.layout.rollouts(0)
    assert shard_task_runs(since) == ["COMPLETED", "COMPLETED"]  # one task run per shard
    rows = check_round(cfg)

    # The shards together hold the trees of one unsharded rollout (same seeded task draw), and
    # scoring reads the shards' files as one table: the same scores as the concatenation in one file.
    local = load_config(overrides=[f"runs_dir={tmp_path}", "run_name=local", *TOY,
                                   f"rollout.num_tasks={TASKS}", f"rollout.group_size={G}"])  # fmt: skip
    roll_out(Run(local), 0)
    assert (local.layout.rollouts(0) / "nodes.parquet").is_file()  # one shard: today's layout
    assert {r["tree_id"] for r in rows} == {r["tree_id"] for r in load_round(local.layout, 0).to_pylist()}
    one_file = tmp_path / "concatenated.parquet"
    pq.write_table(load_round(cfg.layout, 0), one_file)
    expected = score_nodes(one_file, cfg.scoring).to_pylist()
    scores = read_partition(score_round(cfg.run_dir, 0, cfg.scoring), "scores").to_pylist()
    assert scores == expected and len({s["reward"] for s in scores}) > 1  # order-sensitive


# No Prefect retries: only Ray can bring it back. Named as the flow's shards are.
@task(name="rollout-shard", task_run_name="rollout-r{round_}-shard-{shard}", cache_policy=NO_CACHE)
def dying_shard(run: Run, round_: int, shard: int) -> str:
    """On its first attempt a shard's worker is SIGKILLed: shard 0 right after its partition is
    complete (the retry must not write it again), shard 1 with what a crash mid-write leaves, a
    partition folder without marker holding half a file and a temporary folder (the retry must
    replace them atomically)."""
    once = Path(run.config.runs_dir) / f"killed-shard-{shard}"
    if once.exists():
        return stages.rollout_shard.fn(run, round_, shard)
    if shard == 0:
        path = Path(stages.rollout_shard.fn(run, round_, shard))
        once.write_text(str((path / "nodes.parquet").stat().st_mtime_ns))
    else:
        part = run.layout.rollouts(round_) / "shard=1"
        (part.parent / ".tmp-shard=1-deadbeef").mkdir(parents=True)
        part.mkdir()
        (part / "nodes.parquet").write_bytes(b"PAR1 half a file")
        once.write_text("")
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


@pytest.mark.slow
def test_lost_workers_shards_are_retried_without_duplicates(
    ray_cluster, prefect_server, tmp_path, monkeypatch
):
    from flows.training import rollout_flow

    monkeypatch.setattr(stages, "rollout_shard", dying_shard)  # what the flow maps over Ray
    overrides, cfg = sharded_config(tmp_path)
    since = datetime.now(UTC)
    rollout_flow(overrides=overrides)
    assert (tmp_path / "killed-shard-0").is_file() and (tmp_path / "killed-shard-1").is_file()
    assert shard_task_runs(since) == ["COMPLETED", "COMPLETED"]  # Ray re-ran the same task runs
    check_round(cfg)
    first_write = int((tmp_path / "killed-shard-0").read_text())
    assert (cfg.layout.rollouts(0) / "shard=0" / "nodes.parquet").stat().st_mtime_ns == first_write


def timeless(summary: dict) -> dict:
    """An evaluation summary without its wall-clock figures (the rest is the trees')."""
    return {k: {f: v for f, v in d.items() if f != "seconds_per_tree"} if isinstance(d, dict) else d
            for k, d in summary.items()}  # fmt: skip


def test_local_eval_shards_are_one_evaluation(tmp_path):
    """A sharded evaluation on the real shipped checkpoint (greedy, HFEngine) holds, token for
    token, the trees of one unsharded evaluation, and summarises to the same figures."""
    # 1 medium + 1 hard held-out task, a shard each; each shard's engine in this process (no 8 engine
    # processes to start: they sample what it samples, tests/engines/test_hf_process.py)
    base = [f"runs_dir={tmp_path}", "eval.num_tasks=1", "policy.engine_processes=0"]
    one = load_config(overrides=[*base, "run_name=one"])
    two = load_config(overrides=[*base, "run_name=two", "rollout.shards=2"])
    summaries = [timeless(evaluate(Run(cfg), 0)) for cfg in (one, two)]
    assert read_meta(two.layout.eval(0))["parts"] == ["shard=0", "shard=1"]
    assert (one.layout.eval(0) / "nodes.parquet").is_file()  # one shard: the unsharded layout
    cols = ["task_id", "sample", "depth", "status", "success", "token_ids"]
    rows = [sorted(read_partition(c.layout.eval(0), "nodes").select(cols).to_pylist(),
                   key=lambda r: (r["task_id"], r["depth"], r["token_ids"])) for c in (one, two)]  # fmt: skip
    assert rows[0] == rows[1] and len({r["task_id"] for r in rows[0]}) == 2
    assert summaries[0] == summaries[1]

    shutil.copytree(Run(two).checkpoints.initial(), two.layout.checkpoint(1))  # a version 1 to evaluate
    evaluate_shard(Run(two), 1, 0)  # a version started with 2 shards is finished with 2
    three = load_config(overrides=[*base, "run_name=two", "rollout.shards=3", "eval.num_tasks=2"])
    with pytest.raises(ValueError, match="the evaluation of version 1 was started with 2 shards"):
        evaluate(Run(three), 1)


@pytest.mark.slow
def test_evaluation_shards_on_ray(ray_cluster, prefect_server, tmp_path):
    """`rao eval` with runner=ray: one `evaluate-shard` task run per shard on the Ray instance the
    flow found (and left running), sealed as one evaluation equal to a local one."""
    from flows.training import evaluate_flow

    overrides, cfg = sharded_config(tmp_path, "eval.num_tasks=2")
    since = datetime.now(UTC)
    summary = evaluate_flow(overrides=overrides, version=0)
    assert ray.is_initialized()  # ray_session and the task runner leave a Ray they did not start
    assert shard_task_runs(since, "evaluate") == ["COMPLETED", "COMPLETED"]
    assert read_meta(cfg.layout.eval(0))["parts"] == ["shard=0", "shard=1"]
    local = load_config(overrides=[*overrides, "run_name=local", "rollout.runner=local", "rollout.shards=1"])
    evaluate(Run(local), 0)  # the scripted expert's tree shapes are not seeded per tree: compare the draw
    roots = [sorted(r["tree_id"] for r in read_partition(c.layout.eval(0), "nodes").to_pylist() if r["depth"] == 0)
             for c in (cfg, local)]  # fmt: skip
    assert roots[0] == roots[1] and len(roots[0]) == summary["all"]["trees"] == 4
