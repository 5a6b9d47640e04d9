"""What a run folder was made with, and which configuration changes a resumed run may bring.

A run folder keeps its resolved configuration (config.yaml). Resuming with another one is safe
only where the change cannot alter a stage that already completed: completed stages are reused
as they are (their outputs are never recomputed), so a changed `scoring.lam` would silently keep
the old scores. So, on resume:

- a change to a setting that completed stages depend on is refused, with one line listing the keys,
  unless the user starts a new branch of rounds (`rao train --branch NAME [--from-round N]`): a
  new run folder that shares rounds < N with this one and runs the rest with the new settings;
- a change that only affects what has not run yet (more rounds, where the engine runs, tracking)
  is allowed and recorded in config_history.jsonl with the first round that uses it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from rao_core.config import ConfigError, RunConfig, explain, save_config, to_dict
from rao_core.config.loading import SECTIONS, migrate_file
from rao_core.config.train import CORRECTION_SETTINGS
from rao_core.envs.args import migrate_suite_settings
from rao_core.envs.registry import SuiteError, filled_args, registered_name, suite_class
from rao_core.layout import RunLayout

MODEL_ENGINES = ("hf", "vllm")  # the same model and sampling: switching between them is free


def flatten(data: dict) -> dict[str, Any]:
    """{'agent': {'max_depth': 6}} -> {'agent.max_depth': 6} (suite_args.* too); field values (lists,
    dicts) stay whole."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if (key in SECTIONS or key == "suite_args") and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def changes(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """Keys whose value differs between a stored configuration `old` (read as today's: comparable)
    and a loaded one `new` (to_dict of a RunConfig). A key the old file lacks took the default of
    its day: assumed equal to today's (a key the new configuration lacks was retired, and is
    ignored). A comma list of an older file (`medium,hard`) equals the list it means."""
    before, after = flatten(comparable(old)), flatten(new)
    return {k: (before[k], v) for k, v in after.items() if k in before and not _same(before[k], v)}


def comparable(data: dict) -> dict:
    """A configuration as today's, to compare: an older file migrated (keys that became arguments
    dropped, a built-in suite's settings moved into its suite_args: envs/args.py), and suite_args
    with the suite's defaults filled in, so that leaving a setting out and giving its default are
    the same."""
    data = migrate_suite_settings(migrate_file(data), registered_name(data.get("suite")))
    try:
        return {
            **data,
            "suite_args": filled_args(suite_class(str(data.get("suite"))), data.get("suite_args") or {}),
        }
    except (SuiteError, TypeError):
        return data  # a suite that cannot be read now: its raw arguments


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, str) and isinstance(new, list):
        return [x.strip() for x in old.split(",") if x.strip()] == [str(x) for x in new]
    return old == new


def is_free(key: str) -> bool:
    """A setting no completed stage depends on (its field says `resume="free"` in sections.py):
    scheduling, placement, where servers live, tracking, what is decided per round or command."""
    return explain.is_free(key)


def engine_switch(key: str, old: dict, new: dict) -> bool:
    """hf <-> vllm: the same model and the same seeded sampling, another server of it."""
    return key == "policy.kind" and {old.get("policy", {}).get("kind"), new["policy"]["kind"]} <= set(
        MODEL_ENGINES
    )


def irrelevant(key: str, old: dict, new: dict) -> bool:
    """Settings that neither configuration uses: the warm start of a run that did not train one, the
    judge of a run without one, and the corrections of stale trees where no tree is stale (k = 0;
    a run folder from before trust_region and kl_guard became `auto` resumes as it was)."""
    if key.startswith("train.") and key.removeprefix("train.") in CORRECTION_SETTINGS:
        return all(
            (c.get("campaign") or {}).get("max_staleness", 0) == 0
            and (c.get("train") or {}).get("corrections", "stale_rounds") == "stale_rounds"
            for c in (old, new)
        )
    if key.startswith("warmstart."):
        return old.get("policy", {}).get("model") != "warmstart" and new["policy"]["model"] != "warmstart"
    if key.startswith("judge."):
        return old.get("judge", {}).get("kind", "none") == "none" and new["judge"]["kind"] == "none"
    return False


def completed_any(run_dir: Path) -> bool:
    """Has any stage of this run completed (data, warm start, a rollout, an evaluation)?"""
    run = RunLayout(run_dir)
    return (run_dir / "data").is_dir() or run.warmstart_complete() or run.started()


def stored_config(run_dir: Path) -> dict | None:
    path = RunLayout(run_dir).config
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return data if isinstance(data, dict) else None


def check_resume(cfg: RunConfig) -> dict[str, tuple[Any, Any]]:
    """The changes against the run folder's stored configuration; ConfigError when one of them
    would alter a completed stage. Reads only: safe for `rao train --check`."""
    old = stored_config(cfg.run_dir)
    if old is None:
        return {}
    new = to_dict(cfg)
    if old.get("suite", cfg.suite) != cfg.suite:
        raise ConfigError(
            f"run_name: {cfg.run_dir} holds a {old['suite']} run, this configuration is {cfg.suite}; "
            "choose another run_name (or remove the folder)"
        )
    diff = {k: v for k, v in changes(old, new).items() if not irrelevant(k, old, new)}
    blocking = [k for k in diff if not is_free(k) and not engine_switch(k, old, new)]
    if blocking and completed_any(cfg.run_dir):
        listed = ", ".join(f"{k} ({diff[k][0]!r} -> {diff[k][1]!r})" for k in blocking)
        raise ConfigError(
            f"run_name: {cfg.run_dir} has completed stages made with other settings: {listed}; "
            f"use a new run_name, or branch: rao train --branch NEW_NAME [--from-round N] ..."
        )
    return diff


def record(cfg: RunConfig, diff: dict[str, tuple[Any, Any]], first_round: int, **extra: Any) -> None:
    """Save the configuration and, when it changed, a line of history naming the first round it applies to."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    if diff or extra:
        entry = {"round": first_round, "time": time.time(), "changes": {k: list(v) for k, v in diff.items()}}
        with cfg.layout.history.open("a") as f:
            f.write(json.dumps({**entry, **extra}, default=str) + "\n")
    save_config(cfg, cfg.layout.config)


def history(run_dir: Path) -> list[dict]:
    path = RunLayout(run_dir).history
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


def _link_tree(src: Path, dest: Path) -> None:
    """Copy a folder by hard links (files are never modified in place, so sharing them is safe)."""
    shutil.copytree(src, dest, copy_function=_link_or_copy, dirs_exist_ok=True)


def _link_or_copy(src: str, dest: str) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def branch(source: RunConfig, cfg: RunConfig, from_round: int) -> None:
    """Start run `cfg.run_name` as a branch of `source`'s run: it shares the data, the warm start and
    rounds < from_round (rollouts, scores, checkpoints up to version from_round); evaluations are
    shared only when `eval.*` did not change. The branch then runs with `cfg`."""
    src, dest = source.run_dir, cfg.run_dir
    diff = changes(stored_config(src) or {}, to_dict(cfg))
    parts = branch_parts(source, cfg, from_round, diff)  # every check before anything is written
    try:
        for part in parts:
            _link_tree(src / part, dest / part)
        record(cfg, diff, from_round, branch_of=str(src), from_round=from_round)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # no half-made branch
        raise


def branch_parts(source: RunConfig, cfg: RunConfig, from_round: int, diff: dict | None = None) -> list[str]:
    """The folders a branch shares, after checking that it can be made (`rao train --branch --check`
    runs this alone)."""
    src, dest = source.run_dir, cfg.run_dir
    if dest.exists():
        raise ConfigError(f"--branch: {dest} exists already; choose another name")
    run = RunLayout.open(src)
    if not run.config.is_file():
        raise ConfigError(f"--branch: no run at {src} to branch from")
    if diff is None:
        diff = changes(stored_config(src) or {}, to_dict(cfg))
    shared = [p for p in (src / "data", run.warmstart) if p.is_dir()]
    for r in range(from_round):
        for part in (run.rollouts(r), run.scores(r)):
            if not run.complete(part):
                raise ConfigError(
                    f"--from-round: {from_round}: round {r} of {src} is not complete ({part.name})"
                )
        if not run.checkpoint_complete(r + 1):
            raise ConfigError(
                f"--from-round: {from_round}: round {r} of {src} is not complete ({run.checkpoint(r + 1).name})"
            )
        shared += [run.rollouts(r), run.scores(r), run.checkpoint(r + 1)]
    if not any(k.startswith("eval.") and not is_free(k) for k in diff):
        shared += [run.eval(v) for v in range(from_round + 1) if run.complete(run.eval(v))]
    return [str(p.relative_to(src)) for p in shared]
