"""The rollout stage end to end on a toy world: trees to Parquet, read back with DuckDB."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from flows.cli import main
from rao_core.eval.metrics import load_round, summarize
from rao_core.run import Run
from rao_core.stages.rollout import roll_out
from rao_core.store.parquet import clean_temporaries, is_complete, write_partition
from rao_core.store.schema import NODE_SCHEMA
from tests.conftest import TOY

ROOT = Path(__file__).resolve().parents[1]


def test_recursive_rollout_writes_consistent_trees(toy):
    cfg = toy(
        "rollout.num_tasks=3", "rollout.group_size=2", "policy.error_rate=0", "rollout.difficulty=easy,medium"
    )
    path = roll_out(Run(cfg), 0)
    assert is_complete(path)
    table = pq.read_table(path / "nodes.parquet")
    assert table.schema.equals(NODE_SCHEMA, check_metadata=False)
    rows = table.to_pylist()
    ids = {r["node_id"]: r for r in rows}
    roots = [r for r in rows if r["parent_id"] is None]
    assert len(roots) == 6 and len(ids) == len(rows)
    for r in rows:
        if r["parent_id"] is not None:
            parent = ids[r["parent_id"]]
            assert r["depth"] == parent["depth"] + 1 and r["tree_id"] == parent["tree_id"]
        assert len(r["token_ids"]) == len(r["action_mask"]) == r["prompt_tokens"] + r["action_tokens"]
        assert r["logprobs"] == [] and r["status"] == "finished"
    assert all(r["success"] == 1.0 for r in roots)  # error-free expert, solvable tasks
    assert any(r["depth"] > 0 for r in rows)  # it delegated
    s = summarize(load_round(cfg.layout, 0))
    assert s["trees"] == 6 and s["root_success"] == 1.0 and s["max_depth"] >= 1


def test_duckdb_reads_the_partition_directly(toy):
    cfg = toy()
    path = roll_out(Run(cfg), 0)
    con = duckdb.connect()
    rows = con.execute(
        "SELECT depth, count(*), avg(success) FROM read_parquet($p) GROUP BY depth ORDER BY depth",
        {"p": str(path / "nodes.parquet")},
    ).fetchall()
    assert rows[0][0] == 0 and rows[0][1] == 4  # 2 tasks x G=2 roots


def test_single_agent_mode_is_flat(toy):
    cfg = toy("agent.mode=single", "policy.error_rate=0")
    roll_out(Run(cfg), 0)
    rows = load_round(cfg.layout, 0).to_pylist()
    assert {r["depth"] for r in rows} == {0} and all(r["success"] == 1.0 for r in rows)
    assert all("launch_subagent" not in r["transcript"] for r in rows)
    assert all(r["mode"] == "single" for r in rows)


def test_expert_error_rate_makes_imperfect_trees(toy):
    cfg = toy("rollout.num_tasks=6", "rollout.group_size=3", "policy.error_rate=0.5")
    roll_out(Run(cfg), 0)
    rows = load_round(cfg.layout, 0).to_pylist()
    assert any(r["success"] == 0.0 for r in rows)
    assert any("Error:" in r["transcript"] for r in rows)  # mistakes hit the tools' error strings


def test_second_rollout_of_a_round_is_a_no_op(toy):
    cfg = toy()
    path = roll_out(Run(cfg), 0)
    stamp = (path / "nodes.parquet").stat().st_mtime_ns
    assert roll_out(Run(cfg), 0) == path
    assert (path / "nodes.parquet").stat().st_mtime_ns == stamp


def test_interrupted_write_leaves_nothing_visible(tmp_path, monkeypatch):
    import rao_core.store.parquet as parquet

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(parquet.pq, "write_table", boom)
    dest = tmp_path / "rollouts" / "round=0"
    with pytest.raises(OSError):
        write_partition({"nodes": NODE_SCHEMA.empty_table()}, dest)
    assert not dest.exists() and list((tmp_path / "rollouts").iterdir()) == []


@pytest.mark.slow
def test_killed_rollout_never_shows_a_partial_partition(tmp_path):
    """SIGKILL a real `rao rollout` mid-run: either no partition or a complete one, then resume."""
    sets = [
        f"runs_dir={tmp_path}",
        *TOY,
        "rollout.num_tasks=4",
        "rollout.group_size=2",
        "policy.latency_s=0.05",
    ]
    args = [sys.executable, "-m", "flows.cli", "rollout", "--no-progress", *_flags(sets)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    workers: list[int] = []
    while len(workers) < 2 and proc.poll() is None and time.time() < deadline:  # trees running
        workers = _descendants(proc.pid)
        time.sleep(0.05)
    assert proc.poll() is None and workers, "the rollout ended before it could be killed mid-run"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    rollouts = tmp_path / "default" / "rollouts"
    visible = list(rollouts.glob("round=*")) if rollouts.exists() else []
    assert all(is_complete(p) for p in visible)  # none, or a whole one: never a partial partition
    clean_temporaries(rollouts)
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    table = pq.read_table(rollouts / "round=0" / "nodes.parquet")
    assert table.num_rows > 0 and len(set(table.column("node_id").to_pylist())) == table.num_rows
    # no orphaned sandbox workers of the killed run: they die with their orchestrator
    while [p for p in workers if _alive(p)] and time.time() < deadline:
        time.sleep(0.05)
    assert not [p for p in workers if _alive(p)]


def _flags(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (the sandbox zygote and its workers)."""
    parents: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        ppid = next(line.split()[1] for line in text.splitlines() if line.startswith("PPid:"))
        parents[int(status.parent.name)] = int(ppid)
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cli_rollout_and_bad_config(toy, capsys, tmp_path):
    cfg = toy()
    code = main(["rollout", "--no-progress", *_flags([f"runs_dir={tmp_path}", *TOY, "rollout.num_tasks=1"])])
    assert code == 0 and "root_success" in capsys.readouterr().out
    assert is_complete(cfg.layout.rollouts(0))
    code = main(["rollout", "--set", "agent.max_steps=zero"])
    err = capsys.readouterr().err
    assert (
        code == 2 and err.strip() == "config error: agent.max_steps: 'zero': input should be a valid integer"
    )
    code = main(
        ["rollout", *_flags([f"runs_dir={tmp_path}", *TOY, "rollout.difficulty=extreme", "run_name=other"])]
    )
    assert code == 2 and "no train tasks of difficulty 'extreme'" in capsys.readouterr().err


def test_targets_are_json_text(toy):
    cfg = toy()
    roll_out(Run(cfg), 0)
    for r in load_round(cfg.layout, 0).to_pylist():
        targets = json.loads(r["targets"])
        assert all(isinstance(v, int) and v > 0 for v in targets.values())
