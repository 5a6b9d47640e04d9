"""The names a suite author imports (docs/own-task.md, "What is public"), and the promise that keeps
them put: a public name that moves keeps its old import path working, with a FutureWarning naming
the new one, for the release that moves it and at least the two after it.

A move is one entry of MOVED: the old module, each name it held and where that name lives now.
An old module that no longer exists is served by the finder below (installed by rao_core/__init__);
a name that leaves a module that stays is served by that module's `__getattr__ = forward(__name__)`.
tests/test_public_api.py imports every `from rao_core... import ...` of the docs, every PUBLIC name
and every old path of MOVED.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# module -> the names a suite of yours may import from it (docs/own-task.md lists the same)
PUBLIC: dict[str, tuple[str, ...]] = {
    "rao_core.envs.base": ("Environment", "LaunchError", "ScorerError", "Suite", "SuiteContext", "Task"),
    "rao_core.policy": ("Generation", "GenerationRequest", "NodeState", "Policy"),
    "rao_core.envs.expert": ("ScriptedExpert",),
    "rao_core.store.files": ("atomic_write",),
}


@dataclass(frozen=True)
class Move:
    names: dict[str, str]  # name -> the module it lives in now
    moved_in: str  # the release whose code moved it
    until: str  # the first release that may drop the old path (two releases later, at least)


MOVED: dict[str, Move] = {
    "rao_core.agent.policy": Move(
        {
            "Generation": "rao_core.policy",
            "GenerationRequest": "rao_core.policy",
            "NodeState": "rao_core.policy",
            "Policy": "rao_core.policy",
            "ScriptedExpert": "rao_core.envs.expert",
        },
        moved_in="0.1.0",
        until="0.3.0",
    ),
}


def notice(old: str, names: list[str] | None = None) -> str:
    """The FutureWarning's text: where each name of `old` lives now."""
    move = MOVED[old]
    by_new: dict[str, list[str]] = {}
    for name, new in move.names.items():
        if names is None or name in names:
            by_new.setdefault(new, []).append(name)
    where = "; ".join(f"from {new} import {', '.join(n)}" for new, n in by_new.items())
    return f"{old} moved in rao {move.moved_in}: {where} (the old path works until rao {move.until})"


def _resolve(old: str, name: str) -> Any:
    new = MOVED[old].names.get(name)
    if new is None:
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    return getattr(importlib.import_module(new), name)


def forward(old: str) -> Callable[[str], Any]:
    """A module's `__getattr__` for the names MOVED lists under it (a name that left a module that
    stays): each found where it lives now, with the FutureWarning."""

    def __getattr__(name: str) -> Any:
        if name not in MOVED.get(old, Move({}, "", "")).names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(notice(old, [name]), FutureWarning, stacklevel=2)
        return _resolve(old, name)

    return __getattr__


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a moved module's old path: a module whose names are the new ones, with one warning."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name, f"Moved: {notice(spec.name)}.")
        module.__getattr__ = lambda name: _resolve(spec.name, name)  # type: ignore[method-assign]
        module.__all__ = list(MOVED[spec.name].names)  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        warnings.warn(notice(module.__name__), FutureWarning, stacklevel=2)


def install() -> None:
    """Put the old paths' finder last on sys.meta_path (once): a real module always wins."""
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.append(_OldPaths())
