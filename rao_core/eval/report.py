"""Reports people look at: the paper-style comparison table, learning curves of both arms, and
depth reached against task difficulty. Inputs are evaluation summaries (rao_core.eval.metrics);
outputs are markdown text and PNG files (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rao_core.store.files import atomic_write

DIFFICULTY_ORDER = ("easy", "medium", "hard", "extreme")


def difficulties(summary: dict[str, Any]) -> list[str]:
    """The difficulty keys of an evaluation summary, easiest first."""
    keys = [
        k for k, v in summary.items() if isinstance(v, dict) and {"success", "gain"} & set(v) and k != "all"
    ]
    return sorted(keys, key=lambda k: (DIFFICULTY_ORDER.index(k) if k in DIFFICULTY_ORDER else 99, k))


def _cell(m: dict[str, Any] | None) -> str:
    if not m or not m.get("trees"):
        return "—"
    return f"{100 * m['success']:.0f}% [{100 * m['success_ci_low']:.0f}–{100 * m['success_ci_high']:.0f}]"


def comparison_markdown(result: dict[str, Any], title: str = "") -> str:
    """Rows: difficulty (and all). Columns: single and recursive per context limit. Each cell is
    success with its 95% Wilson interval; a second table gives the cost of each cell."""
    cells = {(c["mode"], c["ctx"]): c["summary"] for c in result["cells"]}
    ctxs = sorted({ctx for _, ctx in cells})
    modes = [m for m in ("single", "recursive") if any(k[0] == m for k in cells)]
    diffs = difficulties(next(iter(cells.values()))) + ["all"] if cells else []
    head = [f"{mode} @{ctx}" for ctx in ctxs for mode in modes]
    lines = [f"### {title}" if title else "", ""]
    lines += ["| difficulty | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for d in diffs:
        row = [_cell(cells.get((mode, ctx), {}).get(d)) for ctx in ctxs for mode in modes]
        lines.append(f"| {d} | " + " | ".join(row) + " |")
    n = next(iter(cells.values()))["all"].get("trees", 0) if cells else 0
    lines += ["", f"Success with 95% Wilson interval, greedy, {n} held-out trees per column.", ""]
    lines += [
        "| cell | steps/tree | nodes/tree | max depth | tokens/tree | seconds/tree |",
        "|---|---|---|---|---|---|",
    ]
    for ctx in ctxs:
        for mode in modes:
            a = cells.get((mode, ctx), {}).get("all")
            if a and a.get("trees"):
                lines.append(
                    f"| {mode} @{ctx} | {a['turns_per_tree']:.1f} | {a['nodes_per_tree']:.2f} "
                    f"| {a['max_depth']} | {a['tokens_per_tree']:.0f} | {a['seconds_per_tree']:.2f} |"
                )
    return "\n".join(lines).strip() + "\n"


def curves_markdown(arms: dict[str, dict[int, dict[str, Any]]]) -> str:
    """Held-out success per policy version, one column per (arm, difficulty)."""
    cols = [(arm, d) for arm, versions in arms.items() for d in difficulties(next(iter(versions.values())))]
    versions = sorted({v for vs in arms.values() for v in vs})
    lines = ["| version | " + " | ".join(f"{a} {d}" for a, d in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for v in versions:
        row = [_cell(arms[a].get(v, {}).get(d)) for a, d in cols]
        lines.append(f"| v{v} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def gain_markdown(gains: dict[str, dict[str, Any]]) -> str:
    """One row per (arm, difficulty): success at both versions on the same tasks, the paired gain
    with its 95% bootstrap interval, and tasks better/worse (rao_core.eval.gains.run_gain)."""
    lines = [
        "| arm | difficulty | tasks | first | last | gain, 95% paired interval | better / worse |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, g in gains.items():
        for d in [*difficulties(g["by"]), "all"]:
            m = g["by"].get(d)
            if m:
                lines.append(
                    f"| {arm} v{g['first']} -> v{g['last']} | {d} | {m['tasks']} | {100 * m['first']:.0f}% "
                    f"| {100 * m['last']:.0f}% | {100 * m['gain']:+.1f} [{100 * m['ci_low']:+.1f}, "
                    f"{100 * m['ci_high']:+.1f}] | {m['better']} / {m['worse']} |"
                )
    return "\n".join(lines) + "\n"


def budget_markdown(budgets: dict[str, list[dict[str, Any]]]) -> str:
    """What each arm's rollouts spent, summed over rounds (sql/reports/rollout_budget.sql)."""
    lines = [
        "| arm | rounds | trees | nodes | sampled tokens | prompt tokens | rollout seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, rows in budgets.items():
        t = {
            k: sum(r[k] or 0 for r in rows)
            for k in ("trees", "nodes", "sampled_tokens", "prompt_tokens", "seconds")
        }
        lines.append(
            f"| {arm} | {len(rows)} | {t['trees']} | {t['nodes']} | {t['sampled_tokens']:,} "
            f"| {t['prompt_tokens']:,} | {t['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def delegation_markdown(
    arms: dict[str, dict[int, dict[str, Any]]], rollouts: dict[str, list[dict[str, Any]]]
) -> str:
    """Per arm and policy version: how often the root delegated and how deep trees went, on the
    held-out tasks (greedy evaluation) and in the training rollouts that version sampled."""
    lines = [
        "| arm | version | held-out: root delegates | mean depth | success "
        "| rollouts: root delegates | mean depth | root success |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda x: "" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    num = lambda x: "" if x is None else f"{x:.2f}"  # noqa: E731
    for arm, versions in arms.items():
        sampled = {r["policy_version"]: r for r in rollouts.get(arm, [])}
        for v in sorted(versions.keys() | sampled.keys()):
            e, r = versions.get(v, {}).get("all", {}), sampled.get(v, {})
            lines.append(
                f"| {arm} | v{v} | {pct(e.get('root_delegation_rate'))} | {num(e.get('mean_max_depth'))} "
                f"| {pct(e.get('success'))} | {pct(r.get('root_delegation_rate'))} "
                f"| {num(r.get('mean_max_depth'))} | {pct(r.get('root_success'))} |"
            )
    return "\n".join(lines) + "\n"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curves(arms: dict[str, dict[int, dict[str, Any]]], out: Path) -> Path:
    """Success against policy version, per difficulty (colour) and arm (line style), with the
    Wilson interval as a band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"recursive": "-", "single": "--"}
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for arm, versions in arms.items():
        vs = sorted(versions)
        for i, d in enumerate(difficulties(versions[vs[0]]) + ["all"]):
            ms = [versions[v].get(d, {}) for v in vs]
            x = [v for v, m in zip(vs, ms, strict=True) if m.get("trees")]
            ms = [m for m in ms if m.get("trees")]
            colour = "black" if d == "all" else colours[i % len(colours)]
            ax.plot(x, [m["success"] for m in ms], styles.get(arm, ":"), marker="o", color=colour,
                    label=f"{arm} {d}")  # fmt: skip
            ax.fill_between(x, [m["success_ci_low"] for m in ms], [m["success_ci_high"] for m in ms],
                            color=colour, alpha=0.08)  # fmt: skip
    ax.set(xlabel="policy version (0 = warm start)", ylabel="held-out success", ylim=(0, 1.02))
    ax.xaxis.get_major_locator().set_params(integer=True)  # versions are whole numbers
    ax.set_title("Learning curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out)


def plot_runs(runs: dict[str, dict[int, dict[str, Any]]], out: Path, difficulty: str = "all") -> Path:
    """One line per run (seeds, settings) of held-out success on one difficulty: the spread of
    reruns at a glance, each point with its Wilson interval."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (name, versions) in enumerate(runs.items()):
        vs = [v for v in sorted(versions) if versions[v].get(difficulty, {}).get("trees")]
        dodge = 0.08 * (i - (len(runs) - 1) / 2)  # side by side, so the intervals stay readable
        ms = [versions[v][difficulty] for v in vs]
        lo = [m["success"] - m["success_ci_low"] for m in ms]
        hi = [m["success_ci_high"] - m["success"] for m in ms]
        ax.errorbar([v + dodge for v in vs], [m["success"] for m in ms], yerr=[lo, hi], marker="o", capsize=2, alpha=0.85,
                    label=name)  # fmt: skip
    ax.set(xlabel="policy version (0 = warm start)", ylabel=f"held-out success ({difficulty})")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"Held-out success per run ({difficulty})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out)


def sft_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step loss rows of a warm start's SFT phase (train_log.jsonl), in order."""
    return [r for r in rows if r.get("phase") == "sft" and "loss" in r]


def plot_sft_loss(logs: dict[str, list[dict[str, Any]]], out: Path, window: int = 25) -> Path:
    """The warm start's SFT loss against optimizer step, one line per warm start (its
    train_log.jsonl rows), as the median of each `window` logged values on a log scale: single
    batches swing by 100x once the copy slips are rare, the median shows the trend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for name, rows in logs.items():
        sft = sft_rows(rows)
        chunks = [sft[i : i + window] for i in range(0, len(sft), window)]
        steps = [c[-1]["step"] for c in chunks]
        medians = [sorted(r["loss"] for r in c)[len(c) // 2] for c in chunks]
        ax.plot(steps, medians, marker=".", label=name)
    ax.set(xlabel="optimizer step", ylabel=f"SFT loss (median of {window} logged steps)", yscale="log")
    ax.set_title("Warm start")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, out)


def plot_delegation(
    arms: dict[str, dict[int, dict[str, Any]]], rollouts: dict[str, list[dict[str, Any]]], out: Path
) -> Path:
    """Two panels against policy version: the share of roots that delegate, and the mean depth
    reached; solid lines are the greedy held-out evaluation, dashed the sampled training rollouts."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(dict.fromkeys([*arms, *rollouts])):
        colour = colours[i % len(colours)]
        ev = {v: s["all"] for v, s in arms.get(arm, {}).items() if s.get("all", {}).get("trees")}
        ro = {r["policy_version"]: r for r in rollouts.get(arm, [])}
        for ax, key in ((left, "root_delegation_rate"), (right, "mean_max_depth")):
            for points, style, what in ((ev, "-", "held-out"), (ro, "--", "rollouts")):
                vs = sorted(points)
                if vs:
                    ax.plot(vs, [points[v][key] for v in vs], style, marker="o", color=colour,
                            label=f"{arm} {what}")  # fmt: skip
    left.set(xlabel="policy version (0 = warm start)", ylabel="roots that delegate", ylim=(-0.02, 1.02))
    right.set(xlabel="policy version (0 = warm start)", ylabel="mean depth reached (root = 0)")
    for ax in (left, right):
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    fig.suptitle("Delegation per policy version")
    return _save(fig, out)


def plot_depth_by_difficulty(cells: dict[str, dict[str, Any]], out: Path) -> Path:
    """Mean and maximum depth reached per difficulty, one bar group per labelled summary."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    diffs = difficulties(next(iter(cells.values())))
    width = 0.8 / max(1, len(cells))
    for i, (label, summary) in enumerate(cells.items()):
        xs = [j + i * width for j in range(len(diffs))]
        means = [summary.get(d, {}).get("mean_max_depth", 0) for d in diffs]
        bars = ax.bar(xs, means, width, label=f"{label}: mean")
        ax.scatter(xs, [summary.get(d, {}).get("max_depth", 0) for d in diffs], marker="_", s=200,
                   color=bars[0].get_facecolor(), label=f"{label}: max")  # fmt: skip
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(diffs))], diffs)
    ax.set(xlabel="task difficulty", ylabel="depth reached (root = 0)")
    ax.set_title("Depth reached against difficulty")
    ax.legend(fontsize=7)
    return _save(fig, out)


def _save(fig: Any, out: Path) -> Path:
    """Write atomically: a reader (MLflow, the UI) never sees half a PNG."""
    fig.tight_layout()
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out
