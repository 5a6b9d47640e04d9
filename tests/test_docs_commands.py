"""Every `rao ...` command line in the README and docs parses with today's flags, and every
`--set key=value` in it names a field that exists: a renamed flag or setting fails here. Where
the docs show a command's error (`$ rao ...` then `config error: ...`), the error is today's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from flows.cli import parser
from rao_core.config import ConfigError
from rao_core.run import load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"[\[<>{}]|\.\.\.|KEY=|NEW_NAME|TREE_ID|\bN\b|\bF\b|\bM\b|\bR\b|\bDIR\b|\bD\b")
COMMAND = re.compile(r"(\.venv/bin/)?rao \w")


def commands() -> list[tuple[str, str, str | None]]:
    """(doc, command line, the error the doc shows for it or None)."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S):
            lines = [x.strip() for x in block.replace("\\\n", " ").splitlines()]
            for i, line in enumerate(lines):
                line = re.split(r"\s{2,}|\s#", line.removeprefix("$ "))[0].strip()
                shown = (
                    lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith("config error:") else None
                )
                if COMMAND.match(line) and not PLACEHOLDER.search(line):
                    found.append((doc.name, line, shown))
        for line in re.findall(r"`((?:\.venv/bin/)?rao [^`]+ --[^`]+)`", text):
            if not PLACEHOLDER.search(line):
                found.append((doc.name, line, None))
    return sorted(set(found), key=lambda x: (x[0], x[1]))


def test_the_docs_show_commands():
    assert len(commands()) >= 20


@pytest.mark.parametrize("doc, line, shown", commands(), ids=[f"{d}: {c}" for d, c, _ in commands()])
def test_documented_command_parses(doc, line, shown):
    parsed = parser().parse_args(shlex.split(line)[1:])  # an unknown subcommand or flag exits here
    overrides = getattr(parsed, "overrides", None)
    if overrides is None:
        return
    try:
        load_config(getattr(parsed, "config", None), overrides, check_files=False)
    except ConfigError as e:
        if "config file not found" in str(e):  # a user's own run.yaml: the flags still parsed
            return
        assert shown == f"config error: {e}"
        return
    assert shown is None, "the docs show an error this command no longer gives"


def test_the_readme_fits_on_a_page():
    """The README is the project's front page: 150 lines at most; the rest lives in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines"
