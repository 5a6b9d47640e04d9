"""The plugin API stays put (rao_core/public.py): every `from rao_core... import ...` of the docs'
code blocks imports, as written and without a warning; the names docs/own-task.md teaches are the
public ones; and a public name that moved keeps its old path working, with a FutureWarning naming
the new one, until the release its move names (at least two releases later)."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
import types
import warnings
from pathlib import Path

import pytest

from rao_core import public

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "examples").rglob("*.md")),
]
# What was public when the promise was made (rao 0.1.0). A name may leave PUBLIC only through MOVED.
PROMISED = {
    "rao_core.envs.base": {"Environment", "LaunchError", "ScorerError", "Suite", "SuiteContext", "Task"},
    "rao_core.policy": {"Generation", "GenerationRequest", "NodeState", "Policy"},
    "rao_core.envs.expert": {"ScriptedExpert"},
    "rao_core.store.files": {"atomic_write"},
}
IMPORT = re.compile(r"^\s*from (rao_core[\w.]*) import (\([^)]*\)|[^\n]+)", re.M)


def doc_imports(page: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every `from rao_core... import ...` inside the page's fenced code blocks."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", page.read_text(), re.S)
    found = []
    for block in blocks:
        for module, names in IMPORT.findall(block):
            names = [n.strip().split(" as ")[0] for n in names.strip("()").replace("\n", ",").split(",")]
            found.append((module, [n for n in names if n and not n.startswith("#")]))
    return found


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_every_import_of_the_docs_works_as_written():
    seen = 0
    for page in PAGES:
        for module, names in doc_imports(page):
            with warnings.catch_warnings():
                warnings.simplefilter("error", FutureWarning)  # the docs teach the new paths
                mod = importlib.import_module(module)
                missing = [n for n in names if not hasattr(mod, n)]
            assert not missing, f"{page.name}: from {module} import {', '.join(missing)}"
            seen += 1
    assert seen >= 5


def test_own_task_teaches_the_public_names_and_lists_them():
    taught = {(m, n) for m, names in doc_imports(ROOT / "docs" / "own-task.md") for n in names}
    public_names = {(m, n) for m, names in public.PUBLIC.items() for n in names}
    assert taught and taught <= public_names, taught - public_names
    section = (ROOT / "docs" / "own-task.md").read_text().split("## What is public")[1].split("\n## ")[0]
    for module, names in public.PUBLIC.items():
        assert f"`{module}`" in section and all(f"`{n}`" in section for n in names), module


def test_what_was_promised_still_imports_from_where_it_was():
    for module, names in PROMISED.items():
        for name in names:
            if name in public.PUBLIC.get(module, ()):
                assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
            else:  # it moved: the old path must still serve it until the release its move names
                move = public.MOVED.get(module)
                assert move is not None and name in move.names, f"{module}.{name} left without a MOVED entry"


@pytest.mark.parametrize("old", sorted(public.MOVED))
def test_an_old_path_works_with_a_warning_naming_the_new_one(old, monkeypatch):
    move = public.MOVED[old]
    current = version(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])
    assert version(move.until) >= version(move.moved_in)[:1] + (version(move.moved_in)[1] + 2, 0)
    if current >= version(move.until):
        pytest.skip(f"{old}: kept until {move.until}, this is {current}")
    monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = importlib.import_module(old)
    said = [str(w.message) for w in caught if w.category is FutureWarning]
    assert len(said) == 1 and all(f"from {new} import" in said[0] for new in move.names.values()), said
    for name, new in move.names.items():
        assert getattr(mod, name) is getattr(importlib.import_module(new), name)


def test_a_name_that_leaves_a_module_that_stays_is_forwarded(monkeypatch):
    monkeypatch.setitem(
        public.MOVED, "old_home", public.Move({"Policy": "rao_core.policy"}, "0.1.0", "0.3.0")
    )
    old = types.ModuleType("old_home")
    old.__getattr__ = public.forward("old_home")
    with pytest.warns(FutureWarning, match=r"from rao_core.policy import Policy \(the old path works until"):
        assert old.Policy is importlib.import_module("rao_core.policy").Policy
    with pytest.raises(AttributeError):
        old.Nothing  # noqa: B018


def test_a_suite_written_from_the_old_docs_still_checks(tmp_path, monkeypatch, capsys):
    """docs/own-task.md of 2026-12-03 taught `from rao_core.agent.policy import ...`: such a suite
    passes `rao train --check`, with the FutureWarning."""
    from flows.cli import main

    page = (ROOT / "docs" / "own-task.md").read_text()
    sums = re.search(r"<!-- file: sums.py -->\n```python\n(.*?)```", page, re.S).group(1)
    old = sums.replace("from rao_core.policy import", "from rao_core.agent.policy import")
    assert old != sums
    name = f"oldsums_{tmp_path.name[-8:].replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(old)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rao_core.agent.policy", raising=False)
    with pytest.warns(
        FutureWarning, match=r"rao_core.agent.policy moved in rao 0.1.0: from rao_core.policy import"
    ):
        rc = main(["train", "--check", "--set", f"suite={name}:Sums", "--set", f"runs_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 0, err
