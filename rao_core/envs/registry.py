"""Finding a suite by name: one door for ours and for a user's.

    suite: textcraft-small           # a name registered in the `rao.suites` entry-point group
    suite: mypkg.tasks:MySuite       # an import path, module:attribute (no install needed)

Our suites register under `rao.suites` in pyproject.toml, exactly as an installed package of
tasks would in its own. Every failure is one line that names what was wrong: ConfigError when it
comes from a configuration.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ValidationError

from rao_core.config import EvalConfig, RolloutConfig, WarmStartConfig
from rao_core.envs.base import Suite, SuiteContext

GROUP = "rao.suites"


class SuiteError(ValueError):
    """A suite that cannot be found or used: one line naming the suite and what is wrong."""


def registered() -> dict[str, str]:
    """Registered suite names -> their import paths (installed packages included)."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def registered_name(suite: Any) -> Any:
    """A built-in or installed suite named by its import path, as its registered name."""
    return next((name for name, path in registered().items() if path == suite), suite)


def import_object(path: str, what: str) -> Any:
    """`module:attribute` (dots allowed in both) -> the object; SuiteError naming `what` otherwise."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise SuiteError(f"{what}: {path!r}: expected module:attribute, e.g. mypkg.tasks:MySuite")
    if (
        os.getcwd() not in sys.path
    ):  # `rao` is a console script: make ./mypkg importable, as `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise SuiteError(f"{what}: {path!r}: cannot import {module_name}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SuiteError(f"{what}: {path!r}: module {module_name} has no {attr}")
        obj = getattr(obj, part)
    return obj


def suite_class(name: str) -> type[Suite]:
    """The Suite class a `suite` value names, checked for the interface."""
    if ":" in name:
        cls = import_object(name, "suite")
    else:
        known = registered()
        if name not in known:
            raise SuiteError(
                f"suite: {name!r}: not a registered suite ({', '.join(sorted(known))}); a suite of "
                "your own is named by import path, module:Class"
            )
        cls = import_object(known[name], "suite")
    if not (isinstance(cls, type) and issubclass(cls, Suite)):
        raise SuiteError(f"suite: {name!r}: {cls!r} is not a subclass of rao_core.envs.base.Suite")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise SuiteError(f"suite: {name!r}: {cls.__name__} does not implement {', '.join(missing)}")
    return cls


def suite_args(cls: type[Suite], raw: dict[str, Any]) -> BaseModel | None:
    """`suite_args` validated by the suite's own model (one line naming the key on failure)."""
    if cls.Args is None:
        if raw:
            raise SuiteError(f"suite_args: {cls.__name__} takes no arguments (got {', '.join(sorted(raw))})")
        return None
    try:
        return cls.Args.model_validate(raw)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
    parts = [str(p) for p in err["loc"] if p != "[key]"]  # "[key]": pydantic's tag of a dict's key
    key = ".".join(["suite_args", *parts])
    if err["type"] == "missing":
        raise SuiteError(f"{key}: required by {cls.__name__}")
    if err["type"] == "extra_forbidden":
        known = ", ".join(cls.Args.model_fields)
        raise SuiteError(f"{key}: not a setting of {cls.__name__} (it has: {known})")
    # the model's own rule (a validator's ValueError): its message, without pydantic's prefix
    why = err["ctx"]["error"] if err["type"] == "value_error" else err["msg"][0].lower() + err["msg"][1:]
    raise SuiteError(f"{key}: {err.get('input')!r}: {why}")


def filled_args(cls: type[Suite], raw: dict[str, Any]) -> dict[str, Any]:
    """`suite_args` as the suite reads them: validated, every default filled in (what a saved
    config.yaml holds, so leaving a setting out and giving its default are the same)."""
    args = suite_args(cls, raw)
    return args.model_dump(mode="json") if args is not None else {}


def check_suite(cls: type[Suite], args: Any, ctx: SuiteContext, labels: dict[str, list[str]]) -> None:
    """The splits and difficulties the run uses (`labels`, from labels_used) are ones the suite
    declares, and the suite's own rules hold (Suite.check)."""
    try:
        splits, difficulties = cls.labels(args)
        cls.check(ctx, args)
    except SuiteError:
        raise
    except ValueError as e:
        raise SuiteError(str(e)) from None
    for key, values in labels.items():
        allowed = splits if key.endswith("split") else difficulties
        bad = [v for v in values if v not in allowed]
        if bad:
            raise SuiteError(
                f"{key}: {bad[0]!r}: not a {'split' if key.endswith('split') else 'difficulty'} of "
                f"{cls.__name__} (it has: {', '.join(allowed)})"
            )


def suite_defaults(cls: type[Suite], args: Any) -> list[dict]:
    """The suite's configuration layers (SuiteError when the suite cannot say, e.g. unreadable data)."""
    try:
        return cls.defaults(args)
    except SuiteError:
        raise
    except ValueError as e:
        raise SuiteError(str(e)) from None


def labels_used(
    rollout: RolloutConfig, held_out: EvalConfig, warmstart: WarmStartConfig
) -> dict[str, list[str]]:
    """The splits and difficulties a run asks of its suite (rollout.*, eval.*, warmstart.*), by key."""
    return {
        "rollout.split": [rollout.split],
        "eval.split": [held_out.split],
        "rollout.difficulty": list(rollout.difficulty),
        "eval.difficulty": list(held_out.difficulty),
        "warmstart.eval_difficulties": list(warmstart.eval_difficulties),
    }
