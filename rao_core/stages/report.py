"""The report stage: what a run reports: one line per stage for the flow's log, each round's figures, the held-out
history, and the campaign's report files (learning curves, gains, delegation, comparisons), also
logged to MLflow. Read back from the stages' outputs only; nothing here changes a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rao_core.eval.metrics import load_round, summarize, summarize_eval
from rao_core.layout import RunLayout
from rao_core.run import Run
from rao_core.stages.common import note
from rao_core.store.files import write_text
from rao_core.store.parquet import clean_temporaries, read_meta


# -- one line per stage, for the flow run's log ------------------------------------------------
def rollout_line(run: Run, round_: int) -> str:
    s = summarize(load_round(run.layout, round_))
    seconds = read_meta(run.layout.rollouts(round_)).get("seconds", 0.0)
    return (
        f"{run.name} round {round_} rollout: {s['trees']} trees, {s['nodes']} nodes, root success "
        f"{s['root_success']:.3f}, max depth {s['max_depth']}, {failure_counts(s)}, {seconds:.1f} s"
    )


def failure_counts(s: dict[str, Any]) -> str:
    """The policy's failures (by how its nodes ended) apart from the scorer's and the machine's."""
    policy = s["policy_failed_nodes"]
    how = ", ".join(f"{'finished below 1' if k == 'finished' else k} {v}" for k, v in sorted(policy.items()))
    return (
        f"policy failures {sum(policy.values())} nodes" + (f" ({how})" if how else "")
        + f", scorer failures {s['scorer_failed_nodes']} nodes, other infrastructure failures "
        f"{s['infra_failed_nodes'] - s['scorer_failed_nodes']} nodes (trees left out of training: "
        f"{s['infra_failed_trees']})"
    )  # fmt: skip


def score_line(run: Run, round_: int) -> str:
    """The round's scoring, and a WARNING line when no group has spread (nothing to train on)."""
    from rao_core.scoring import no_signal, scores_summary

    s = scores_summary(run.dir, round_)
    drops = ", ".join(f"{k} {v}" for k, v in sorted(s["dropped_trees"].items())) or "none"
    g = s["groups"]
    line = (
        f"{run.name} round {round_} score: {s['trained_nodes']} of {s['nodes']} nodes trained, "
        f"{s['trees']} trees, {g['spread']} of {g['groups']} groups with spread; dropped trees by reason: {drops}"
    )
    why = no_signal(g)
    return line + (f"\nWARNING: {run.name} round {round_} trains nothing: {why}" if why else "")


def signal_lines(run: Run) -> list[str]:
    """Under the final table: the groups with spread per round (what RL learns from), and how many
    rounds trained nothing, and why."""
    from rao_core.scoring import no_signal, scores_summary

    layout, spread, idle = run.layout, [], []
    r = 0
    while layout.complete(layout.scores(r)):
        g = scores_summary(run.dir, r)["groups"]
        spread.append(f"r{r} {g['spread']}/{g['groups']}")
        if (why := no_signal(g) or run.checkpoints.metrics(r + 1).get("skipped")) is not None:
            idle.append(f"round {r}: {why}")
        r += 1
    if not spread:
        return []
    lines = [f"{run.name}: groups with spread (what RL learns from), per round: {', '.join(spread)}"]
    if idle:
        lines.append(f"WARNING: {run.name}: {len(idle)} of {r} rounds trained nothing ({'; '.join(idle)})")
    return lines


def train_line(run: Run, round_: int) -> str:
    m = run.checkpoints.metrics(round_ + 1)
    if "skipped" in m:
        return (
            f"WARNING: {run.name} round {round_} train: skipped ({m['skipped']}), version {round_ + 1} "
            f"= {round_}: this round taught the policy nothing"
        )
    moved = ""
    if "served_changed" in m:  # how much of the update reached the weights the engines serve
        total = f", {m['served_changed_total']:.1%} since v0" if "served_changed_total" in m else ""
        moved = (
            f", served weights changed {m['served_changed']:.1%}{total} ({m['served_dtype']}), "
            f"update/weight RMS {m['update_rms_ratio']:.2e}"
        )
    line = (
        f"{run.name} round {round_} train: loss {m['loss']:.4f}, {m['tokens']} tokens "
        f"({m['action_tokens']} action), {m['steps']} steps, mean ratio {m['mean_ratio']:.4f}"
        + (f" ({m['clipped_fraction']:.1%} clipped)" if "clipped_fraction" in m else "")
        + _off_policy(run, round_, m)
        + (f", KL to v0 {m['kl_to_reference']:.4f}" if "kl_to_reference" in m else "")
        + f"{moved}, {m['seconds']:.1f} s{_throughput(m)}"
    )
    return line + (f"\nWARNING: {m['warning']}" if "warning" in m else "")


def _off_policy(run: Run, round_: int, m: dict[str, Any]) -> str:
    """', trained nodes by staleness 0: 120, 1: 34, sampler mismatch KL 2.1e-05': how old the
    trained trees were (campaign.max_staleness) and how far the sampler's log-probs are from this
    version's (the k3 estimate; a checkpoint written before it existed has none)."""
    from rao_core.scoring import scores_summary

    hist = scores_summary(run.dir, round_)["staleness"]
    by_age = ", ".join(f"{k}: {v['trained_nodes']}" for k, v in sorted(hist.items()) if v["trained_nodes"])
    kl = f", sampler mismatch KL {m['mismatch_kl']:.2g}" if "mismatch_kl" in m else ""
    return (f", trained nodes by staleness {by_age}" if by_age else "") + kl + _corrections(m)


def _corrections(m: dict[str, Any]) -> str:
    """', masked by token 1.2%, masked by node 0.4%, behaviour weight truncated 3.1%, KL guard: lr x
    0.31 (KL over 0.004)': what train.token_mask, sequence_mask, proximal_anchor and kl_guard did."""
    parts = [
        f"{label} {m[key]:.1%}"
        for key, label in (
            ("token_masked_fraction", "masked by token"),
            ("sequence_masked_fraction", "masked by node"),
            ("truncated_fraction", "behaviour weight truncated"),
            ("trust_masked_fraction", "masked by trust region"),
        )
        if key in m
    ]
    if "kl_guard_lr_scale" in m:
        parts.append(f"KL guard: lr x {m['kl_guard_lr_scale']:.2g} (KL over {m['kl_guard_threshold']:.2g})")
    return f", {', '.join(parts)}" if parts else ""


def _throughput(m: dict[str, Any]) -> str:
    """', 1,234 tokens/s, 0.0123 TFLOP/s (MFU 31.0%)': model FLOPs, MFU only on a GPU of the table
    (rao_core/train/flops.py); nothing for a checkpoint written before these metrics existed."""
    if "tflops" not in m:
        return ""
    mfu = f" (MFU {m['mfu']:.1%})" if "mfu" in m else ""
    return f", {m['tokens_per_s']:,.0f} tokens/s, {m['tflops']:.3g} TFLOP/s{mfu}"


def eval_line(run: Run, version: int, summary: dict[str, Any]) -> str:
    cells = {d: m for d, m in summary.items() if isinstance(m, dict) and "success" in m}
    order = [d for d in cells if d != "all"] + ["all"] * ("all" in cells)
    text = ", ".join(f"{d} {cells[d]['success']:.3f}" for d in order)
    return f"{run.name} v{version} held-out success: {text} ({cells.get('all', {}).get('trees', 0)} trees)"


def gain_lines(run: Run) -> list[str]:
    """Per arm: the held-out gain of the latest version over the warm start, paired by task."""
    from rao_core.eval import gains

    return [gains.gain_line(a.name, g) for a in run.arms() if (g := gains.run_gain(a.dir))]


def config_change_line(run: Run, diff: dict[str, tuple[Any, Any]]) -> str:
    changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diff.items())
    return f"{run.name}: settings changed from round {run.layout.completed_rounds()}: {changed}"


# -- the figures of a round and of the run -----------------------------------------------------
def round_report(run: Run, round_: int) -> dict[str, Any]:
    """The figures of round r, read back from its stages' outputs: evaluation of the new policy
    (success by difficulty and depth, tree shape, tokens), the rollout, rewards and advantages, the
    training update (loss, tokens/s) and time per stage."""
    from rao_core.scoring import scores_summary

    note(run, f"report of round {round_}")
    layout = run.layout
    rollout_meta = read_meta(layout.rollouts(round_))
    rollout = summarize(load_round(run.layout, round_))
    scores = scores_summary(run.dir, round_)
    train = run.checkpoints.metrics(round_ + 1)
    evaluation = summarize_eval(layout.eval(round_ + 1))
    return {
        "eval": evaluation,
        "rollout": {k: v for k, v in rollout.items() if k != "statuses"},
        "scores": {
            **{k: v for k, v in scores.items() if k not in ("round", "dropped_trees")},
            "dropped_trees": sum(scores.get("dropped_trees", {}).values()),
        },
        "train": {k: v for k, v in train.items() if isinstance(v, int | float)},
        "seconds": {"rollout": rollout_meta.get("seconds", 0.0), "train": train.get("seconds", 0.0)},
    }


def summary_markdown(run: Run, round_: int, metrics: dict[str, Any]) -> str:
    ev = metrics["eval"]
    lines = [
        f"# {run.name}: round {round_} (policy version {round_ + 1})",
        "",
        "| difficulty | success | 95% CI | nodes/tree | max depth |",
        "|---|---|---|---|---|",
    ]
    for diff, m in ev.items():
        if isinstance(m, dict) and "success" in m:
            lines.append(
                f"| {diff} | {m['success']:.3f} | {m['success_ci_low']:.2f}-{m['success_ci_high']:.2f} "
                f"| {m['nodes_per_tree']:.1f} | {m['max_depth']} |"
            )
    tr = metrics.get("train", {})
    lines += [
        "",
        f"Loss {tr.get('loss', float('nan')):.4f}, trained samples {tr.get('samples', 0)}, "
        f"mean root reward {metrics['scores'].get('mean_root_reward') or 0:.3f}.",
    ]
    return "\n".join(lines)


def campaign_summary(run: Run) -> dict[str, Any]:
    """Held-out success per policy version and difficulty, from every complete evaluation."""
    return {
        f"v{v}": {k: m["success"] for k, m in ev.items() if isinstance(m, dict) and "success" in m}
        for v, ev in eval_history_of(run.dir).items()
    }


def eval_history_of(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Every complete evaluation summary of the run in `run_dir`, by policy version."""
    layout = RunLayout(run_dir)
    out, v = {}, 0
    while layout.complete(layout.eval(v)):
        out[v] = summarize_eval(layout.eval(v))
        v += 1
    return out


# -- report files ------------------------------------------------------------------------------
CAMPAIGN_REPORTS = ("learning_curves.md", "learning_curves.png", "delegation.png", "depth_by_difficulty.png")


def write_campaign_report(run: Run) -> dict[str, Path]:
    """reports/: learning curves of the arm(s) (table and plot), the paired gain, the rollout
    budget, delegation per version (table and plot) and depth reached against difficulty for the
    latest version of each arm; logged on the campaign's MLflow run."""
    from rao_core.eval import gains, report

    note(run, "the campaign report")
    runs = {arm.config.agent.mode: arm.dir for arm in run.arms()}
    histories = {arm: h for arm, run_dir in runs.items() if (h := eval_history_of(run_dir))}
    out = run.layout.reports
    if not histories:
        return {}
    # a killed writer's half files: only these names' (`rao compare` writes here too)
    for name in CAMPAIGN_REPORTS:
        clean_temporaries(out, name)
    curves_md, curves_png, delegation_png, depth_png = (out / name for name in CAMPAIGN_REPORTS)
    gain = {arm: g for arm in histories if (g := gains.run_gain(runs[arm]))}
    budget = {arm: gains.rollout_budget(runs[arm]) for arm in histories}
    delegation = {arm: gains.delegation_by_round(runs[arm]) for arm in histories}
    text = "## Held-out success per version (95% Wilson intervals)\n\n" + report.curves_markdown(histories)
    if gain:
        text += "\n## Gain over the warm start, paired by task\n\n" + report.gain_markdown(gain)
    text += "\n## What the rollouts spent\n\n" + report.budget_markdown(budget)
    text += "\n## Delegation per policy version\n\n" + report.delegation_markdown(histories, delegation)
    files = {
        "curves": write_text(curves_md, text),
        "curves_plot": report.plot_learning_curves(histories, curves_png),
        "delegation_plot": report.plot_delegation(histories, delegation, delegation_png),
        "depth_plot": report.plot_depth_by_difficulty(
            {f"{arm} v{max(h)}": h[max(h)] for arm, h in histories.items()}, depth_png
        ),
    }
    tracker = run.tracker
    parent = tracker.campaign_run_id()
    for path in files.values():
        tracker.log_artifacts(parent, path, "reports")
    for arm, g in gain.items():  # gain/<arm>/<difficulty>, its interval, at step = latest version
        metrics = {f"gain/{arm}/{d}{k}": m[key] for d, m in g["by"].items()
                   for k, key in (("", "gain"), ("_ci_low", "ci_low"), ("_ci_high", "ci_high"))}  # fmt: skip
        tracker.log_metrics(parent, metrics, step=g["last"])
    return files


def write_comparison(run: Run, result: dict[str, Any]) -> dict[str, Path]:
    """reports/compare-v<V>.md and its depth plot, the comparison (stages/evaluate.py); logged to MLflow."""
    from rao_core.eval import report

    v, out = result["version"], run.layout.reports
    title = f"{run.name}: policy version {v}, single against recursive"
    files = {
        "table": write_text(out / f"compare-v{v}.md", report.comparison_markdown(result, title)),
        "depth_plot": report.plot_depth_by_difficulty(
            {f"{c['mode']} @{c['ctx']}": c["summary"] for c in result["cells"]},
            out / f"compare-v{v}-depth.png",
        ),
    }
    tracker = run.tracker
    parent = tracker.campaign_run_id()
    for path in files.values():
        tracker.log_artifacts(parent, path, "reports")
    return files
