"""A vLLM server SIGKILLed mid-rollout: the requests in flight wait while it is started again on the
same checkpoint, then go again with the same seeds. The round completes with the rows of an
unbroken round: nothing lost, nothing duplicated, no node scored as a policy failure."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pyarrow.parquet as pq
import pytest

from rao_core.engines.scope import engine_scope
from rao_core.run import Run, load_config
from rao_core.stages.rollout import roll_out

pytestmark = pytest.mark.vllm
ROUND = ["policy.kind=vllm", "rollout.num_tasks=4", "rollout.group_size=2", "rollout.difficulty=medium"]


def served_requests(server) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
    )


def kill_after(server, requests: int, done: threading.Event) -> None:
    """SIGKILL the server's whole process group once it has served `requests` more requests."""
    start = served_requests(server)
    while not done.is_set():
        if served_requests(server) - start >= requests:
            os.killpg(server.proc.pid, signal.SIGKILL)
            return
        done.wait(0.05)


def rows(path) -> dict[str, dict]:
    table = pq.read_table(path / "nodes.parquet").to_pylist()
    assert len({r["node_id"] for r in table}) == len(table)  # no duplicated node
    return {r["node_id"]: r for r in table}


def test_server_killed_mid_rollout_is_restarted_and_the_round_completes(tmp_path, vllm_python):
    with engine_scope() as scope:  # one server for both rounds, as in a campaign
        reference = rows(
            roll_out(Run(load_config(overrides=[f"runs_dir={tmp_path}", "run_name=ref", *ROUND])), 0)
        )
        (server,) = scope.servers.values()
        cfg = load_config(overrides=[f"runs_dir={tmp_path}", "run_name=killed", *ROUND])
        done = threading.Event()
        killer = threading.Thread(target=kill_after, args=(server, 20, done))
        killer.start()
        try:
            killed = rows(roll_out(Run(cfg), 0))
        finally:
            done.set()
            killer.join()
    assert server.restarts == 1  # the kill landed mid-rollout, and the server came back once
    assert sorted(killed) == sorted(reference)
    assert not [r for r in killed.values() if r["status"] == "infra_error" or r["tree_status"] != "ok"]
    for node_id, row in killed.items():  # the same seeds: the same tokens as the unbroken round
        assert row["token_ids"] == reference[node_id]["token_ids"], node_id
