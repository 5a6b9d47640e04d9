"""The installed project: its top-level packages are its own, and what it imports is declared."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_flows_and_tasks_are_this_projects_folders():
    """`flows` and `tasks` are generic names: no other installed distribution may provide them,
    and they import from this checkout."""
    owners = importlib.metadata.packages_distributions()
    for name in ("rao_core", "flows", "tasks"):
        assert set(owners.get(name, [])) == {"rao"}, (name, owners.get(name))
        assert Path(importlib.util.find_spec(name).origin).resolve().is_relative_to(ROOT / name)


def test_every_third_party_import_is_declared():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split("==")[0].split("[")[0].lower().replace("-", "_") for d in declared}
    aliases = {"yaml": "pyyaml", "pyseccomp": "pyseccomp", "bm25s": "bm25s", "prefect_ray": "prefect_ray"}
    optional = {"peft", "ray", "prefect_ray", "vllm", "deepspeed"}  # extras, or imported only when asked for
    imported = set()
    for path in [
        *(ROOT / "rao_core").rglob("*.py"),
        *(ROOT / "flows").rglob("*.py"),
        *(ROOT / "tasks").rglob("*.py"),
    ]:
        if path.name == "vllm_watchdog.py":
            continue  # runs in vLLM's own environment, standard library only
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names} - {"rao_core", "flows", "tasks"}
    missing = {m for m in third_party if aliases.get(m, m).lower() not in names} - optional
    assert missing == set()
