"""The `rao` command: parse arguments, then call a flow or one function of the core.

It lives with the flows because it starts them (`rao train`, `round`, `eval`, `serve`) and sets up
Prefect's environment; rao_core never imports Prefect or this package. `rao --help` lists every
command; README.md shows them with their flags.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings
from pathlib import Path

import yaml

from rao_core import interrupts, watchdog
from rao_core.config import ConfigError, ConfigWarning, to_dict
from rao_core.envs.checks import RunCheckError, check_run
from rao_core.placement import PlacementError
from rao_core.run import load_config
from rao_core.runlock import RunBusy
from rao_core.train.launch import LaunchError


def _config_args(p: argparse.ArgumentParser, check: bool = False) -> None:
    if check:
        p.add_argument(
            "--check",
            action="store_true",
            help="validate the configuration (values, files, the run folder), print it resolved, and exit",
        )
    p.add_argument("--config", help="YAML file with any subset of the configuration")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field, e.g. --set rollout.num_tasks=4 (repeatable)",
    )


def _print_summary(summary: dict, path: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rollout -> {path}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "trees",
        "nodes",
        "root_success",
        "nodes_per_tree",
        "max_depth",
        "delegation_rate",
        "node_turns",
        "wall_seconds",
    ):
        value = summary[key]
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    for depth, s in summary["success_by_depth"].items():
        table.add_row(f"success at depth {depth}", f"{s:.3f}")
    table.add_row("statuses", ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())))
    table.add_row("policy failures", str(sum(summary["policy_failed_nodes"].values())))
    table.add_row("scorer failures", str(summary["scorer_failed_nodes"]))
    Console().print(table)


def _prefect_env() -> None:
    """Project-local Prefect home, no analytics, and time for the temporary server to start."""
    os.environ.setdefault("PREFECT_HOME", str(Path.cwd() / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _print_campaign(cfg) -> None:
    from rich.console import Console
    from rich.table import Table

    from rao_core.envs.suites import difficulty_order
    from rao_core.run import Run
    from rao_core.stages import report

    run = Run(cfg)
    summary = report.campaign_summary(run)
    seen = {d for v in summary.values() for d in v if d != "all"}
    order = difficulty_order(cfg.suite, cfg.suite_args)
    difficulties = [d for d in order if d in seen] + sorted(seen - set(order))
    table = Table(title=f"held-out success: {cfg.run_dir}")
    for col in ("policy", *difficulties, "all"):
        table.add_column(col, justify="right")
    for version, row in summary.items():
        table.add_row(version, *(f"{row.get(d, float('nan')):.3f}" for d in (*difficulties, "all")))
    Console().print(table)
    for line in report.gain_lines(run) + report.signal_lines(run):
        print(line)


def _checked(args: argparse.Namespace):
    """Every check that needs no work: values, files, and what the run folder already holds (read
    only). With --check, print the resolved configuration and stop: nothing runs, nothing is written."""
    from rao_core import campaign, memory, resume
    from rao_core.models import locate
    from rao_core.run import Run

    cfg = Run.load(args.config, args.overrides).config  # the flow started next gets this same Run
    if getattr(args, "branch", None):
        resume.branch_parts(cfg, *_branch(args, cfg))
    else:
        resume.check_resume(cfg)
    try:  # the suite's expert, task labels and counts (tasks synthesized to a temporary folder)
        for warning in check_run(cfg, synthesize=args.check):
            print(warning, file=sys.stderr)
    except RunCheckError as e:
        raise ConfigError(str(e)) from None
    campaign.check_overlap(
        cfg.policy, cfg.train, cfg.campaign.max_staleness
    )  # rounds that overlap: engines and trainer on devices they can share
    if cfg.policy.kind != "scripted":  # a .gguf converted, a hub id downloaded: once, before any stage
        locate.prepare(cfg.policy.model, cfg.policy.tokenizer, cfg.warmstart.init_model)
    plan = memory.check(cfg.policy, cfg.train)  # refuses a plan that cannot fit, with the numbers
    if not args.check:
        _free(cfg)
    if args.check:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        if plan:
            print(plan, file=sys.stderr)
        print(f"# configuration valid ({cfg.run_dir}); --check: nothing was run", file=sys.stderr)
    return cfg


def _ready_for_a_flow(args: argparse.Namespace):
    """The checked configuration, with Prefect's environment set; None after --check (done)."""
    cfg = _checked(args)  # fail on bad input, or a run another process writes, before Prefect starts
    if args.check:
        return None
    _prefect_env()
    return cfg


def _free(cfg) -> None:
    """One writer per run folder: refuse in one line while another process writes this one."""
    from rao_core import runlock

    if (other := runlock.holder(cfg.run_dir)) is not None:
        raise runlock.RunBusy(
            f"{cfg.run_dir} is being written by {runlock.describe(other)}; wait for it to end"
        )


def _branch(args: argparse.Namespace, cfg):
    """The configuration of the branch `--branch` names, and the first round it does not share."""
    branched = load_config(args.config, [*args.overrides, f"run_name={args.branch}"])
    return branched, cfg.layout.completed_rounds() if args.from_round is None else args.from_round


def cmd_train(args: argparse.Namespace) -> int:
    cfg = _ready_for_a_flow(args)
    if cfg is None:
        return 0
    overrides = list(args.overrides)
    if args.branch:
        from rao_core import resume

        branched, start = _branch(args, cfg)
        resume.branch(cfg, branched, start)
        print(f"branch {branched.run_dir}: rounds < {start} shared with {cfg.run_dir}", file=sys.stderr)
        cfg, overrides = branched, [*overrides, f"run_name={args.branch}"]
    from flows.training import train_flow

    with temporary_server():
        result = train_flow(config=args.config, overrides=overrides)
    _print_campaign(cfg)
    if result.get("stopped"):
        print(f"WARNING: {result['stopped']}", file=sys.stderr)
        return 1
    return 0


def cmd_warmstart(args: argparse.Namespace) -> int:
    import shlex

    from rao_core.train.warmstart_job import run_warmstart

    cfg = load_config(args.config, args.overrides)
    if args.check:
        print(yaml.safe_dump({"warmstart": to_dict(cfg)["warmstart"]}, sort_keys=False), end="")
        return 0
    command = shlex.join(["rao", *sys.argv[1:]]) if sys.argv[1:2] == ["warmstart"] else shlex.join(sys.argv)
    run_warmstart(cfg, Path(args.out), command, Path(args.ship) if args.ship else None, args.eval_only)
    return 0


def cmd_round(args: argparse.Namespace) -> int:
    cfg = _ready_for_a_flow(args)
    if cfg is None:
        return 0
    from flows.training import round_flow

    with temporary_server():
        round_flow(config=args.config, overrides=args.overrides)
    _print_campaign(cfg)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    cfg = _ready_for_a_flow(args)
    if cfg is None:
        return 0
    from flows.training import evaluate_flow

    with temporary_server():
        result = evaluate_flow(
            config=args.config, overrides=args.overrides, version=args.version, compare=args.compare
        )
    if args.compare:
        table = cfg.layout.reports / f"compare-v{result['version']}.md"
        print(table.read_text() + f"\n(written to {table})")
    else:
        print(json.dumps(result, indent=1, default=str))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    _prefect_env()
    load_config(args.config, args.overrides)
    from flows.serve import serve_all

    serve_all(args.config, args.overrides, args.interval_minutes)
    signum = interrupts.received()
    return interrupts.exit_code(signum) if signum else 0


def cmd_deploy(args: argparse.Namespace) -> int:
    _prefect_env()
    load_config(args.config, args.overrides)
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        print("error: rao deploy needs a standing Prefect server: set PREFECT_API_URL", file=sys.stderr)
        return 2
    from flows.serve import deploy_to_pool

    names = deploy_to_pool(args.pool, args.config, args.overrides, args.interval_minutes)
    print(f"{len(names)} deployments on work pool {args.pool}: {', '.join(names)}")
    print(
        f"run them with: prefect worker start --pool {args.pool}  (PREFECT_API_URL={PREFECT_API_URL.value()})"
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from rao_core import campaign, resume, runlock
    from rao_core.run import Run

    cfg = load_config(args.config, args.overrides)
    if not cfg.run_dir.is_dir():
        print(f"error: no run at {cfg.run_dir}", file=sys.stderr)
        return 2
    cfg.layout.migrate()
    if (writer := runlock.holder(cfg.run_dir)) is not None:
        print(f"in progress: {runlock.describe(writer)}")
    stored = resume.stored_config(cfg.run_dir) or {}  # the run's own rounds, not this command's default
    run = Run(cfg)
    rounds = max(stored.get("campaign", {}).get("rounds", 0), run.layout.completed_rounds())
    table = Table(title=f"{cfg.run_dir}: {run.layout.completed_rounds()} of {rounds} rounds complete")
    rows = campaign.status(run, rounds or None)
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*("yes" if v is True else "-" if v is False else str(v) for v in row.values()))
    Console().print(table)
    _print_campaign(cfg)
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from rao_core import runlock
    from rao_core.campaign import broken_scorer, engines
    from rao_core.eval.metrics import load_round, summarize
    from rao_core.run import Run
    from rao_core.stages.rollout import roll_out
    from rao_core.stages.synthesize import prepare

    cfg = _checked(args)
    if args.check:
        return 0
    if cfg.rollout.runner == "ray":  # the shards in parallel as Ray tasks: through the flow
        _prefect_env()
        from flows.training import rollout_flow

        with temporary_server():
            path = rollout_flow(config=args.config, overrides=args.overrides, round_=args.round)
    else:
        run = Run(cfg)
        with runlock.writing(cfg.run_dir, "rao rollout"), engines(run):
            prepare(run)
            path = roll_out(run, args.round, progress=not args.no_progress)
    _print_summary(summarize(load_round(cfg.layout, args.round)), str(path))
    if why := broken_scorer(Run(cfg), args.round):
        print(f"WARNING: {why}", file=sys.stderr)
        return 1
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    import json

    from rao_core import runlock
    from rao_core.run import Run
    from rao_core.scoring import scores_summary
    from rao_core.stages.score import score

    cfg = load_config(args.config, args.overrides)
    with runlock.writing(cfg.run_dir, "rao score"):
        path = score(Run(cfg), args.round)
    print(f"scores -> {path}")
    print(json.dumps(scores_summary(cfg.run_dir, args.round), indent=2, default=str))
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from rao_core import runlock
    from rao_core.envs.suites import open_suite

    cfg = load_config(args.config, args.overrides)
    with runlock.writing(cfg.run_dir, "rao synth"):
        print(open_suite(cfg).dir)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    if args.explain is not None:  # every key (or a section's, or one) with default, rule and help
        from rao_core.config.explain import explain
        from rao_core.envs.args import moved_hint
        from rao_core.envs.registry import SuiteError, suite_class
        from rao_core.run import named_suite, read_layers

        try:  # the suite the layers name (for its suite_args): the rest need not be complete or valid
            Args = suite_class(named_suite(read_layers(args.config, args.overrides)[0])).Args
            print(explain(args.explain or None, Args))
        except SuiteError as e:
            raise ConfigError(str(e)) from None
        except KeyError as e:
            raise ConfigError(f"--explain: {moved_hint(args.explain) or e.args[0]}") from None
        return 0
    print(yaml.safe_dump(to_dict(load_config(args.config, args.overrides)), sort_keys=False), end="")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from rao_core.eval.viewer import show_tree

    run_dir = Path(args.run_dir) if args.run_dir else load_config(args.config, args.overrides).run_dir
    print(f"tree viewer -> {show_tree(run_dir, args.tree_id, args.round, args.out)}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from rao_core.doctor import Check, checks
    from rao_core.memory import check as memory_plan

    cfg = load_config(args.config, args.overrides, check_files=False)
    rows = checks(cfg)
    table = Table(title="rao doctor")
    for col in ("component", "found", "status", "needed by this config"):
        table.add_column(col)
    for c in rows:
        status = (
            "[green]ok[/green]"
            if c.ok
            else ("[red]missing[/red]" if c.needed else "[yellow]missing[/yellow]")
        )
        table.add_row(c.name, c.found, status, "yes" if c.needed else "-")
    Console().print(table)
    try:
        plan = memory_plan(cfg.policy, cfg.train)
    except ConfigError as e:
        plan, rows = str(e), [*rows, Check("memory", "does not fit", False, True)]
    if plan:
        print(plan)
    missing = [c.name for c in rows if c.needed and not c.ok]
    if missing:
        print(f"missing for this configuration: {', '.join(missing)}", file=sys.stderr)
    return 1 if missing else 0


def cmd_sql(args: argparse.Namespace) -> int:
    from rao_core.query import sql_main

    run_dir = args.run_dir or load_config(args.config, args.overrides, check_files=False).run_dir
    return sql_main(run_dir, args.query, args.file, args.max_rows, args.full)


def parser() -> argparse.ArgumentParser:
    """Every subcommand with its flags."""
    parser = argparse.ArgumentParser(prog="rao", description="Recursive Agent Optimization")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="the main job: warm start, then RL rounds (Prefect flow, MLflow)")
    _config_args(p, check=True)
    p.add_argument(
        "--branch",
        metavar="NEW_NAME",
        help="continue this run as a new run NEW_NAME with the changed settings (shares its earlier rounds)",
    )
    p.add_argument(
        "--from-round", type=int, default=None, help="--branch: rounds shared (default: all completed ones)"
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("warmstart", help="train the warm start (warmstart.* settings) into a folder")
    _config_args(p, check=True)
    p.add_argument("--out", required=True, help="work folder (expert data, model/, metrics.json, logs)")
    p.add_argument("--ship", help="then copy the checkpoint, metrics, log and command into this folder")
    p.add_argument("--eval-only", action="store_true", help="only evaluate <out>/model into its metrics.json")
    p.set_defaults(func=cmd_warmstart)

    p = sub.add_parser("round", help="one more round on the latest checkpoint")
    _config_args(p, check=True)
    p.set_defaults(func=cmd_round)

    p = sub.add_parser("eval", help="evaluate a policy version on held-out tasks")
    _config_args(p, check=True)
    p.add_argument("--version", type=int, default=-1, help="policy version (default: the latest)")
    p.add_argument(
        "--compare",
        action="store_true",
        help="single against recursive at each of eval.context_limits (reports/compare-v<V>.md)",
    )
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("serve", help="register the flows with a Prefect server (UI triggers, schedule)")
    _config_args(p)
    p.add_argument("--interval-minutes", type=float, default=None, help="schedule one more round this often")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("deploy", help="register the flows on a Prefect process work pool, for its workers")
    _config_args(p)
    p.add_argument("--pool", required=True, help="the work pool (a process pool, created if missing)")
    p.add_argument("--interval-minutes", type=float, default=None, help="schedule one more round this often")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("status", help="where a run stands: stages complete per round, held-out success")
    _config_args(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("rollout", help="roll out G trees for each of N root tasks to Parquet")
    _config_args(p, check=True)
    p.add_argument(
        "--round", type=int, default=0, help="the round to roll out, with policy version ROUND (default 0)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("score", help="score a rolled-out round in SQL (rewards, baselines, advantages)")
    _config_args(p)
    p.add_argument("--round", type=int, default=0, help="the round to score (default 0)")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("synth", help="synthesize the world and task files of a run")
    _config_args(p)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("config", help="print the resolved configuration, or explain its keys")
    _config_args(p)
    p.add_argument(
        "--explain", nargs="?", const="", metavar="SECTION|KEY",
        help="every key (or a section's, or one key) with its default, rule, help and resume rule",
    )  # fmt: skip
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("show", help="one execution tree as a standalone HTML page (the tree viewer)")
    p.add_argument("tree_id", help='a tree id; list them with: rao sql "select distinct tree_id from nodes"')
    _config_args(p)
    p.add_argument("--run-dir", help="run folder (default: the run of --config/--set, runs/default)")
    p.add_argument("--round", type=int, default=None, help="round (default: the latest holding the tree)")
    p.add_argument("--out", help="HTML file to write (default <run>/viewer/round=R/<tree>.html)")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("doctor", help="installed components and versions; exit 1 if the config lacks one")
    _config_args(p)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("sql", help="query a run's tables (nodes, scores, samples) read-only")
    p.add_argument("query", nargs="?", help="the SQL text")
    p.add_argument("--file", help="read the SQL from a file")
    _config_args(p)
    p.add_argument("--run-dir", help="run folder (default: the run of --config/--set, runs/default)")
    p.add_argument("--max-rows", type=int, default=50)
    p.add_argument("--full", action="store_true", help="every value whole, one per line (a whole transcript)")
    p.set_defaults(func=cmd_sql)
    return parser


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """A configuration warning is one line for the user, not a source location."""
    if issubclass(category, ConfigWarning):
        return f"warning: {message}\n"
    return _default_format(message, category, filename, lineno, line)


_default_format = warnings.formatwarning


def temporary_server():
    from flows.prefect_server import temporary_server

    return temporary_server()


STARTS_PROCESSES = {"train", "warmstart", "round", "eval", "serve", "rollout"}  # engines, workers, servers


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command != "serve":  # `rao serve` is Prefect's runner, which ends its own flow runs
        interrupts.install()  # Ctrl-C, SIGINT and SIGTERM: one line, exit 130 or 143 (rao_core/interrupts.py)
    if args.command in STARTS_PROCESSES:
        watchdog.start_reaper()  # SIGKILLed, nothing it started lives on (rao_core/watchdog.py)
    warnings.formatwarning = _warning_line
    try:
        return args.func(args)
    except ConfigError as e:  # bad input gets one line; RAO_DEBUG=1 shows the traceback instead
        if os.environ.get("RAO_DEBUG"):
            raise
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, FileExistsError, ValueError, RunBusy, PlacementError, LaunchError) as e:
        if os.environ.get("RAO_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, SIGINT or SIGTERM: every completed stage is kept
        signum = interrupts.received() or signal.SIGINT
        interrupts.kill_descendants()  # nothing this command started outlives it
        if os.environ.get("RAO_DEBUG"):
            raise
        print(interrupts.exit_line(signum), file=sys.stderr)
        return interrupts.exit_code(signum)


if __name__ == "__main__":
    sys.exit(main())
