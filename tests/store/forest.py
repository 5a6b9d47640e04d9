"""Synthetic rollout forests as real `nodes` tables (NODE_SCHEMA), for tests and the benchmark.

Columns are built as lists (not row dicts) so a million nodes build in seconds. Only the columns
scoring reads are random; the others get plain defaults of the right type.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from rao_core.store.parquet import write_partition
from rao_core.store.schema import NODE_SCHEMA

SCORED = ("task_id", "sample", "tree_id", "node_id", "parent_id", "depth", "status", "success", "tree_status")


def _success(rng: random.Random, mode: str) -> float | None:
    if mode == "zero":
        return 0.0
    r = rng.random()
    if r < 0.3:
        return 0.0
    if r < 0.55:
        return 1.0
    if r < 0.6:
        return None  # unknown success: scored as 0
    return rng.random()


def random_forest(
    rng: random.Random,
    *,
    n_tasks: int = 3,
    group_size: int | None = None,
    max_group: int = 6,
    max_depth: int = 4,
    max_children: int = 3,
    p_child: float = 0.6,
    p_timeout: float = 0.15,
    p_infra: float = 0.1,
    p_unfinished: float = 0.2,
    p_gap: float = 0.05,
    p_zero_group: float = 0.15,
    task_prefix: str = "t",
    max_version: int | None = None,
) -> dict[str, list]:
    """Columns of a random forest: n_tasks groups of G trees (G random in 1..max_group if not given).

    Each node has up to max_children children with chance p_child each (fewer deeper down); depth
    gaps (a child recorded two levels down) appear with p_gap; a group is all-zero success with
    p_zero_group so zero-advantage groups occur. With `max_version`, each group is sampled with a
    random policy version in 0..max_version (a tree of another version now and then, a node with
    no version rarely), so that staleness varies.
    """
    cols: dict[str, list] = {k: [] for k in SCORED}
    if max_version is not None:
        cols["policy_version"] = []
    for t in range(n_tasks):
        task = f"{task_prefix}{t}"
        mode = "zero" if rng.random() < p_zero_group else "mixed"
        group_version = rng.randint(0, max_version) if max_version is not None else 0
        for g in range(group_size or rng.randint(1, max_group)):
            tree = f"{task}/{g}"
            version = rng.randint(0, max_version) if max_version and rng.random() < 0.1 else group_version
            timed_out = rng.random() < p_timeout
            infra = not timed_out and rng.random() < p_infra
            stack = [(f"{tree}:0", None, 0)]
            while stack:
                node, parent, depth = stack.pop()
                cols["task_id"].append(task)
                cols["sample"].append(g)
                cols["tree_id"].append(tree)
                cols["node_id"].append(node)
                cols["parent_id"].append(parent)
                cols["depth"].append(depth)
                unfinished = rng.random() < p_unfinished
                failed = rng.choice(("budget", "error", "infra_error") if infra else ("budget", "error"))
                cols["status"].append(failed if unfinished else "finished")
                cols["success"].append(_success(rng, mode))
                cols["tree_status"].append("timeout" if timed_out else "infra_error" if infra else "ok")
                if max_version is not None:
                    cols["policy_version"].append(None if rng.random() < 0.02 else version)
                if depth < max_depth:
                    p = p_child / (1 + depth)
                    k = sum(rng.random() < p for _ in range(max_children))
                    for i in range(k):
                        step = 2 if rng.random() < p_gap and depth + 2 <= max_depth else 1
                        stack.append((f"{node}.{i}", node, depth + step))
    return cols


def _const_list(values: list, n: int, typ: pa.DataType) -> pa.ListArray:
    offsets = np.arange(n + 1, dtype=np.int32) * len(values)
    flat = pa.array(np.tile(np.array(values), n), typ.value_type)
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


def node_table(cols: dict[str, list], run: str = "run", round: int = 0) -> pa.Table:
    """A NODE_SCHEMA table from the given columns; the missing ones get defaults."""
    n = len(cols["node_id"])
    if "children" not in cols:  # sub-agents started: rows whose parent is this node
        kids = Counter(p for p in cols["parent_id"] if p is not None)
        cols = {**cols, "children": [kids.get(x, 0) for x in cols["node_id"]]}
    defaults = {
        "run": [run] * n,
        "round": [round] * n,
        "split": ["train"] * n,
        "mode": ["recursive"] * n,
        "suite": ["textcraft"] * n,
        "policy_version": [round] * n,  # round r samples with version r (campaign.max_staleness 0)
        "success_source": ["verifier"] * n,
        "tree_status": ["ok"] * n,
        "status": ["finished"] * n,
    }
    arrays = []
    for field in NODE_SCHEMA:
        if field.name in cols:
            arrays.append(pa.array(cols[field.name], field.type))
        elif field.name in defaults:
            arrays.append(pa.array(defaults[field.name], field.type))
        elif field.name == "token_ids":
            arrays.append(_const_list([1, 2, 3, 4], n, field.type))
        elif field.name == "action_mask":
            arrays.append(_const_list([0, 0, 1, 1], n, field.type))
        elif field.name == "logprobs":
            arrays.append(_const_list([0.0, 0.0, -0.5, -0.25], n, field.type))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(arrays, schema=NODE_SCHEMA)


def write_round(run_dir: str | Path, round: int, table: pa.Table) -> Path:
    """Store a nodes table where the rollout stage would: rollouts/round=N/nodes.parquet."""
    dest = Path(run_dir) / "rollouts" / f"round={round}"
    return write_partition({"nodes": table}, dest)
