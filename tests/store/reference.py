"""Plain-Python RAO scoring, written from the equations (Eq. 1, 3, 4) and docs/scoring.md's rules.

An independent oracle for the SQL: dictionaries and loops, no DuckDB, nothing shared with sql/.
"""

from __future__ import annotations

from collections import defaultdict

from rao_core.config import ScoringConfig

ZERO = 1e-12


def reference_scores(
    nodes: list[dict], cfg: ScoringConfig, trained_version: int = 0, max_staleness: int = 0
) -> dict[str, dict]:
    """nodes: rows with node_id, parent_id, tree_id, task_id, depth, status, tree_status, success,
    policy_version. The round trains `trained_version`; a tree with a node sampled more than
    `max_staleness` versions before it is dropped as stale.

    Returns node_id -> the scores columns.
    """

    def staleness(n: dict) -> int:
        v = n.get("policy_version")
        return trained_version - (trained_version if v is None else v)

    s = {n["node_id"]: float(n["success"] or 0.0) for n in nodes}

    # Eq. 1: own success plus lambda times the mean of the children's base success.
    kids: dict[str, list[str]] = defaultdict(list)
    for n in nodes:
        if n["parent_id"] is not None:
            kids[n["parent_id"]].append(n["node_id"])
    reward = {}
    for x, cs in ((n["node_id"], kids.get(n["node_id"], [])) for n in nodes):
        bonus = sum(s[c] for c in cs) / len(cs) if cs else 0.0
        reward[x] = s[x] + cfg.lam * bonus

    # Trees, their roots and their groups.
    tree_nodes: dict[str, list[dict]] = defaultdict(list)
    for n in nodes:
        tree_nodes[n["tree_id"]].append(n)
    root = {t: next(n for n in ns if n["parent_id"] is None) for t, ns in tree_nodes.items()}
    groups: dict[str, list[str]] = defaultdict(list)
    for t, r in root.items():
        groups[r["task_id"]].append(t)

    reason: dict[str, str | None] = {}
    for t, ns in tree_nodes.items():
        if max(staleness(n) for n in ns) > max_staleness:
            reason[t] = "stale"
        elif any(n["tree_status"] == "timeout" for n in ns):
            reason[t] = "timeout"
        elif any(n["tree_status"] == "infra_error" for n in ns):
            reason[t] = "infra_error"
        elif cfg.unfinished_roots == "drop" and root[t]["status"] != "finished":
            reason[t] = "unfinished_root"
        else:
            reason[t] = None

    # Eq. 3: leave-one-out mean of the other valid trees' root rewards.
    baseline: dict[str, float | None] = {}
    for trees in groups.values():
        valid = [t for t in trees if reason[t] is None]
        for t in trees:
            if reason[t] is not None:
                baseline[t] = None
            elif len(valid) == 1:
                if cfg.single_tree_groups == "skip":
                    baseline[t], reason[t] = None, "single_tree_group"
                else:
                    baseline[t] = 0.0
            else:
                others = [reward[root[o]["node_id"]] for o in valid if o != t]
                baseline[t] = sum(others) / len(others)
        scored = [t for t in trees if reason[t] is None]
        all_zero = all(abs(reward[n["node_id"]] - baseline[t]) < ZERO for t in scored for n in tree_nodes[t])
        if scored and all_zero and cfg.zero_advantage_groups == "skip":
            for t in scored:
                reason[t] = "zero_advantage_group"

    # Eq. 4: depth weights over the trained nodes.
    n_d: dict[int, int] = defaultdict(int)
    for n in nodes:
        if reason[n["tree_id"]] is None:
            n_d[n["depth"]] += 1
    if cfg.depth_weighting:
        alpha = sum(n_d.values()) / len(n_d) if n_d else 0.0
        w = {d: alpha / c for d, c in n_d.items()}
    else:
        w = defaultdict(lambda: 1.0)

    out = {}
    for n in nodes:
        x, t = n["node_id"], n["tree_id"]
        b = baseline[t]
        adv = reward[x] - b if b is not None else 0.0
        trained = reason[t] is None
        out[x] = {
            "run": n.get("run"),
            "round": n.get("round"),
            "task_id": n["task_id"],
            "tree_id": t,
            "node_id": x,
            "parent_id": n["parent_id"],
            "depth": n["depth"],
            "success": s[x],
            "reward": reward[x],
            "baseline": b,
            "advantage": adv,
            "depth_weight": w.get(n["depth"]) if cfg.depth_weighting else 1.0,
            "weighted_advantage": w[n["depth"]] * adv if trained else 0.0,
            "trained": trained,
            "drop_reason": reason[t],
            "staleness": staleness(n),
        }
    return out
