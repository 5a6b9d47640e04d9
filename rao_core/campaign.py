"""A training campaign: the stages of each round, where their outputs live, and where a run stands.

    warm start -> checkpoint v0 -> evaluate v0
    round r:  rollout (v_r) -> score -> train (v_r -> v_r+1) -> evaluate (v_r+1) -> log

Every stage writes a file-based output marked complete and returns at once when it finds one, so a
killed campaign started again continues from the last completed stage, and a finished one does
nothing. Prefect (flows/, tasks/) only chains these functions; MLflow records them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from rao_core import tracking
from rao_core.config import RunConfig
from rao_core.engines.vllm_server import make_room_for_training
from rao_core.models.paths import initial_model as _initial_model
from rao_core.models.paths import warmstart_dir
from rao_core.store.files import write_json, write_text
from rao_core.store.parquet import is_complete


def round_config(cfg: RunConfig, round_: int) -> RunConfig:
    """The run's configuration with the round and policy version of round `round_`."""
    rollout = dataclasses.replace(cfg.rollout, round=round_, policy_version=round_)
    return dataclasses.replace(cfg, rollout=rollout)


def control_config(cfg: RunConfig) -> RunConfig:
    """The single-agent control arm of a campaign: same model, tasks, budgets and rounds, in the
    run `<run_name>-single`, with no launch_subagent, w = 1 and lambda 0 (the plain group baseline
    of the standard agent-RL recipe), and `campaign.control_tasks` root tasks a round if set.
    A warm start trained by the main arm is shared, not redone."""
    policy = cfg.policy
    if policy.model == "warmstart":
        policy = dataclasses.replace(policy, model=str(initial_model(cfg)))
    return dataclasses.replace(
        cfg,
        run_name=f"{cfg.run_name}-single",
        agent=dataclasses.replace(cfg.agent, mode="single"),
        scoring=dataclasses.replace(cfg.scoring, lam=0.0, depth_weighting=False),
        campaign=dataclasses.replace(cfg.campaign, control_arm=False),
        policy=policy,
        rollout=dataclasses.replace(
            cfg.rollout, num_tasks=cfg.campaign.control_tasks or cfg.rollout.num_tasks
        ),
    )


def arms(cfg: RunConfig) -> list[RunConfig]:
    """The campaign's arms: the run itself, and its single-agent control arm when asked for."""
    return [cfg, control_config(cfg)] if cfg.campaign.control_arm else [cfg]


def checkpoint_dir(cfg: RunConfig, version: int) -> Path:
    return cfg.run_dir / "checkpoints" / f"round-{version}"


def initial_model(cfg: RunConfig) -> Path:
    """Policy version 0: a shipped checkpoint by name, a local folder, or the run's own warm start."""
    return _initial_model(cfg.policy.model, cfg.run_dir)


def model_path(cfg: RunConfig, version: int) -> Path:
    return initial_model(cfg) if version == 0 else checkpoint_dir(cfg, version)


def checkpoint_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


# -- stages ------------------------------------------------------------------------------------
def stage_warm_start(cfg: RunConfig, progress: bool = False) -> Path:
    """Version 0 exists after this: shipped, given, or trained here once with `warmstart.*`
    (the stage's folder is <run>/checkpoints/warmstart/, its checkpoint the `model` folder in it)."""
    path = initial_model(cfg)
    if cfg.policy.model == "warmstart" and not checkpoint_complete(path):
        from rao_core.train.warmstart import warm_start

        warm_start(cfg.warmstart, warmstart_dir(cfg.run_dir), progress=progress)
    return path


def stage_rollout(cfg: RunConfig, round_: int, progress: bool = False) -> Path:
    from rao_core.rollout import rollout_round

    return rollout_round(round_config(cfg, round_), progress, model_path(cfg, round_))


def stage_score(cfg: RunConfig, round_: int) -> Path:
    from rao_core.scoring import score_round

    return score_round(cfg.run_dir, round_, cfg.scoring)


def round_lr(cfg: RunConfig, round_: int) -> float:
    """The learning rate of round `round_`: linear from train.lr at round 0 to train.lr * lr_final
    at the campaign's last round; rounds added later keep the last value."""
    last = max(1, cfg.campaign.rounds - 1)
    return cfg.train.lr * (1 + (cfg.train.lr_final - 1) * min(round_, last) / last)


def stage_train(cfg: RunConfig, round_: int) -> dict[str, Any]:
    """In the flow's process, or as `accelerate launch` on N processes when train.accelerate_config is set."""
    from rao_core.train.stage import launch_round, train_round

    paths = (cfg.run_dir, round_, model_path(cfg, round_), checkpoint_dir(cfg, round_ + 1))
    train = dataclasses.replace(cfg.train, lr=round_lr(cfg, round_))
    tokenizer = None if cfg.policy.tokenizer == "auto" else cfg.policy.tokenizer
    with make_room_for_training():  # vLLM sleeps (or stops) while the trainer runs
        if cfg.train.accelerate_config:
            return launch_round(cfg.train.accelerate_config, *paths, train, initial_model(cfg), tokenizer)
        return train_round(*paths, train, initial_model(cfg), tokenizer)


def stage_evaluate(cfg: RunConfig, version: int, progress: bool = False) -> dict[str, Any]:
    from rao_core.eval.evaluate import evaluate_round

    return evaluate_round(round_config(cfg, version), version, model_path(cfg, version), progress)


# -- tracking ----------------------------------------------------------------------------------
def _marker(cfg: RunConfig, round_: int) -> Path:
    return cfg.run_dir / "logged" / f"round-{round_}.json"


def log_round(cfg: RunConfig, round_: int, metrics: dict[str, Any]) -> bool:
    """Log one round to MLflow once (a marker file makes a resumed campaign skip it)."""
    marker = _marker(cfg, round_)
    if marker.is_file():
        return False
    run_id = tracking.round_run_id(cfg, round_)
    tracking.log_metrics(cfg, run_id, metrics, step=round_)
    # The campaign run plots evaluation against policy version (0 = the warm start, see log_baseline).
    parent = tracking.campaign_run_id(cfg)
    tracking.log_metrics(cfg, parent, {"eval": metrics["eval"]}, step=round_ + 1)
    tracking.log_metrics(cfg, parent, {k: v for k, v in metrics.items() if k != "eval"}, step=round_)
    for folder in ("eval", "scores"):
        part = cfg.run_dir / folder / f"round={round_ + (folder == 'eval')}"
        for name in ("summary.json", "_COMPLETE"):
            if (part / name).is_file():
                tracking.log_artifacts(cfg, run_id, part / name, f"{folder}")
    if cfg.eval.trees_to_render > 0:  # a sample of the round's trees as viewer pages (rao show)
        from rao_core.eval.viewer import write_tree_sample

        pages = cfg.run_dir / "viewer" / f"round={round_}"
        write_tree_sample(cfg.run_dir, round_, cfg.eval.trees_to_render, pages)
        tracking.log_artifacts(cfg, run_id, pages, "trees")
    ckpt = checkpoint_dir(cfg, round_ + 1)
    if cfg.tracking.log_checkpoints and checkpoint_complete(ckpt):
        tracking.log_artifacts(cfg, run_id, ckpt, "checkpoint")
    tracking.finish_run(cfg, run_id)
    write_json(marker, metrics)
    return True


def log_baseline(cfg: RunConfig, eval_metrics: dict[str, Any]) -> bool:
    """Evaluation of policy version 0 on the campaign run, at step 0 (once)."""
    marker = cfg.run_dir / "logged" / "baseline.json"
    if marker.is_file():
        return False
    tracking.log_metrics(cfg, tracking.campaign_run_id(cfg), {"eval": eval_metrics}, step=0)
    write_json(marker, eval_metrics)
    return True


def artifact_key(cfg: RunConfig, *parts: object) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    text = "-".join(str(p) for p in (cfg.run_name, *parts)).lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")


def summary_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """A flat (metric, value) table of a round, for the Prefect UI."""
    return [{"metric": k, "value": round(v, 4)} for k, v in tracking.flatten(metrics).items()]


def summary_markdown(cfg: RunConfig, round_: int, metrics: dict[str, Any]) -> str:
    ev = metrics["eval"]
    lines = [
        f"# {cfg.run_name}: round {round_} (policy version {round_ + 1})",
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


def round_report(cfg: RunConfig, round_: int) -> dict[str, Any]:
    """The figures of round r, read back from its stages' outputs: evaluation of the new policy
    (success by difficulty and depth, tree shape, tokens), the rollout, rewards and advantages, the
    training update (loss, tokens/s) and time per stage."""
    from rao_core.eval.evaluate import summarize_eval
    from rao_core.rollout import load_round, summarize
    from rao_core.scoring import scores_summary

    rollout_meta = json.loads((cfg.run_dir / "rollouts" / f"round={round_}" / "_COMPLETE").read_text())
    rollout = summarize(load_round(cfg, round_))
    scores = scores_summary(cfg.run_dir, round_)
    train_path = checkpoint_dir(cfg, round_ + 1) / "metrics.json"
    train = json.loads(train_path.read_text()) if train_path.is_file() else {}
    evaluation = summarize_eval(cfg.run_dir / "eval" / f"round={round_ + 1}")
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


# -- one line per stage, for the flow run's log ------------------------------------------------
def rollout_line(cfg: RunConfig, round_: int) -> str:
    from rao_core.rollout import load_round, rollout_dir, summarize

    s = summarize(load_round(cfg, round_))
    seconds = json.loads((rollout_dir(cfg, round_) / "_COMPLETE").read_text()).get("seconds", 0.0)
    return (
        f"{cfg.run_name} round {round_} rollout: {s['trees']} trees, {s['nodes']} nodes, root success "
        f"{s['root_success']:.3f}, max depth {s['max_depth']}, infrastructure failures "
        f"{s['infra_failed_trees']} trees ({s['infra_failed_nodes']} nodes), {seconds:.1f} s"
    )


def score_line(cfg: RunConfig, round_: int) -> str:
    from rao_core.scoring import scores_summary

    s = scores_summary(cfg.run_dir, round_)
    drops = ", ".join(f"{k} {v}" for k, v in sorted(s["dropped_trees"].items())) or "none"
    return (
        f"{cfg.run_name} round {round_} score: {s['trained_nodes']} of {s['nodes']} nodes trained, "
        f"{s['trees']} trees; dropped trees by reason: {drops}"
    )


def train_line(cfg: RunConfig, round_: int) -> str:
    m = json.loads((checkpoint_dir(cfg, round_ + 1) / "metrics.json").read_text())
    if "skipped" in m:
        return (
            f"{cfg.run_name} round {round_} train: skipped ({m['skipped']}), version {round_ + 1} = {round_}"
        )
    moved = ""
    if "served_changed" in m:  # how much of the update reached the weights the engines serve
        total = f", {m['served_changed_total']:.1%} since v0" if "served_changed_total" in m else ""
        moved = (
            f", served weights changed {m['served_changed']:.1%}{total} ({m['served_dtype']}), "
            f"update/weight RMS {m['update_rms_ratio']:.2e}"
        )
    line = (
        f"{cfg.run_name} round {round_} train: loss {m['loss']:.4f}, {m['tokens']} tokens "
        f"({m['action_tokens']} action), {m['steps']} steps, mean ratio {m['mean_ratio']:.4f}"
        f"{moved}, {m['seconds']:.1f} s"
    )
    return line + (f"\nWARNING: {m['warning']}" if "warning" in m else "")


def eval_line(cfg: RunConfig, version: int, summary: dict[str, Any]) -> str:
    cells = {d: m for d, m in summary.items() if isinstance(m, dict) and "success" in m}
    order = [d for d in cells if d != "all"] + ["all"] * ("all" in cells)
    text = ", ".join(f"{d} {cells[d]['success']:.3f}" for d in order)
    return (
        f"{cfg.run_name} v{version} held-out success: {text} ({cells.get('all', {}).get('trees', 0)} trees)"
    )


def gain_lines(cfg: RunConfig) -> list[str]:
    """Per arm: the held-out gain of the latest version over the warm start, paired by task."""
    from rao_core.eval import gains

    return [gains.gain_line(a.run_name, g) for a in arms(cfg) if (g := gains.run_gain(a.run_dir))]


def config_change_line(cfg: RunConfig, diff: dict[str, tuple[Any, Any]]) -> str:
    changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diff.items())
    return f"{cfg.run_name}: settings changed from round {completed_rounds(cfg)}: {changed}"


# -- where a run stands ------------------------------------------------------------------------
def completed_rounds(cfg: RunConfig) -> int:
    """Rounds whose evaluation of the new policy is complete (the next round to run)."""
    r = 0
    while is_complete(cfg.run_dir / "eval" / f"round={r + 1}"):
        r += 1
    return r


def status(cfg: RunConfig, rounds: int | None = None) -> list[dict[str, Any]]:
    """Per round: which stages have complete outputs."""
    rounds = rounds if rounds is not None else max(cfg.campaign.rounds, completed_rounds(cfg))
    rows = []
    for r in range(rounds):
        rows.append(
            {
                "round": r,
                "rollout": is_complete(cfg.run_dir / "rollouts" / f"round={r}"),
                "score": is_complete(cfg.run_dir / "scores" / f"round={r}"),
                "train": checkpoint_complete(checkpoint_dir(cfg, r + 1)),
                "eval": is_complete(cfg.run_dir / "eval" / f"round={r + 1}"),
                "logged": _marker(cfg, r).is_file(),
            }
        )
    return rows


def prepare(cfg: RunConfig) -> dict[str, Any]:
    """Before a stage runs: refuse a configuration that would alter completed stages of this run
    folder, then save it (and record any allowed change with the first round it applies to)."""
    from rao_core import resume

    diff = resume.check_resume(cfg)
    first = completed_rounds(cfg)
    resume.record(cfg, diff, first)
    if diff:  # also on the campaign's MLflow run, next to the metrics it explains
        changes = json.dumps({k: list(v) for k, v in diff.items()}, default=str)
        tracking.set_tag(cfg, tracking.campaign_run_id(cfg), f"config_change.round_{first}", changes)
    return diff


def campaign_summary(cfg: RunConfig) -> dict[str, Any]:
    """Held-out success per policy version and difficulty, from every complete evaluation."""
    return {
        f"v{v}": {k: m["success"] for k, m in ev.items() if isinstance(m, dict) and "success" in m}
        for v, ev in eval_history(cfg).items()
    }


def eval_history(cfg: RunConfig) -> dict[int, dict[str, Any]]:
    """Every complete evaluation summary of the run, by policy version."""
    return eval_history_of(cfg.run_dir)


def eval_history_of(run_dir: Path) -> dict[int, dict[str, Any]]:
    from rao_core.eval.evaluate import summarize_eval

    out, v = {}, 0
    while is_complete(run_dir / "eval" / f"round={v}"):
        out[v] = summarize_eval(run_dir / "eval" / f"round={v}")
        v += 1
    return out


def write_campaign_report(cfg: RunConfig) -> dict[str, Path]:
    """reports/: learning curves of the arm(s) (table and plot), the paired gain, the rollout
    budget, delegation per version (table and plot) and depth reached against difficulty for the
    latest version of each arm; logged on the campaign's MLflow run."""
    from rao_core.eval import gains, report

    runs = {cfg.agent.mode: cfg.run_dir}
    if cfg.campaign.control_arm:
        control = control_config(cfg)
        runs[control.agent.mode] = control.run_dir
    arms = {arm: h for arm, run_dir in runs.items() if (h := eval_history_of(run_dir))}
    out = cfg.run_dir / "reports"
    if not arms:
        return {}
    gain = {arm: g for arm in arms if (g := gains.run_gain(runs[arm]))}
    budget = {arm: gains.rollout_budget(runs[arm]) for arm in arms}
    delegation = {arm: gains.delegation_by_round(runs[arm]) for arm in arms}
    text = "## Held-out success per version (95% Wilson intervals)\n\n" + report.curves_markdown(arms)
    if gain:
        text += "\n## Gain over the warm start, paired by task\n\n" + report.gain_markdown(gain)
    text += "\n## What the rollouts spent\n\n" + report.budget_markdown(budget)
    text += "\n## Delegation per policy version\n\n" + report.delegation_markdown(arms, delegation)
    files = {
        "curves": write_text(out / "learning_curves.md", text),
        "curves_plot": report.plot_learning_curves(arms, out / "learning_curves.png"),
        "delegation_plot": report.plot_delegation(arms, delegation, out / "delegation.png"),
        "depth_plot": report.plot_depth_by_difficulty(
            {f"{arm} v{max(h)}": h[max(h)] for arm, h in arms.items()}, out / "depth_by_difficulty.png"
        ),
    }
    parent = tracking.campaign_run_id(cfg)
    for path in files.values():
        tracking.log_artifacts(cfg, parent, path, "reports")
    for arm, g in gain.items():  # gain/<arm>/<difficulty>, its interval, at step = latest version
        metrics = {f"gain/{arm}/{d}{k}": m[key] for d, m in g["by"].items()
                   for k, key in (("", "gain"), ("_ci_low", "ci_low"), ("_ci_high", "ci_high"))}  # fmt: skip
        tracking.log_metrics(cfg, parent, metrics, step=g["last"])
    return files


def write_comparison(cfg: RunConfig, result: dict[str, Any]) -> dict[str, Path]:
    """reports/compare-v<V>.md and its depth plot, from rao_core.eval.compare; logged to MLflow."""
    from rao_core.eval import report

    v, out = result["version"], cfg.run_dir / "reports"
    title = f"{cfg.run_name}: policy version {v}, single against recursive"
    files = {
        "table": write_text(out / f"compare-v{v}.md", report.comparison_markdown(result, title)),
        "depth_plot": report.plot_depth_by_difficulty(
            {f"{c['mode']} @{c['ctx']}": c["summary"] for c in result["cells"]},
            out / f"compare-v{v}-depth.png",
        ),
    }
    parent = tracking.campaign_run_id(cfg)
    for path in files.values():
        tracking.log_artifacts(cfg, parent, path, "reports")
    return files
