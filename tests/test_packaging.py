"""The installed project: its top-level packages are its own, and what it imports is declared."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import sys
import tomllib
from pathlib import Path

import pytest

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
        if path.name == "watchdog.py":
            continue  # runs in vLLM's own environment, standard library only
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names} - {"rao_core", "flows", "tasks"}
    missing = {m for m in third_party if aliases.get(m, m).lower() not in names} - optional
    assert missing == set()


@pytest.mark.slow
def test_the_wheel_installed_elsewhere_rolls_out_and_scores(tmp_path):
    """Build the wheel, install it (not editable) into a fresh environment that borrows only the
    dependencies of this one, and run `rao rollout` and `rao score` from a folder with no
    checkout: the code and the SQL queries come from the installed package."""
    import shutil
    import subprocess
    import sysconfig

    src, dist = tmp_path / "src", tmp_path / "dist"  # built from a copy: the build leaves build/ behind
    src.mkdir()
    for name in ("rao_core", "flows", "tasks", "sql"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = dist.glob("rao-*.whl")
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    # the dependencies, as a plain path: this environment's own .pth files (the editable rao) are not read
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True)  # fmt: skip
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([python, "-c", "import rao_core.store.sqlfiles as s; print(s.__file__, s.SQL_DIR)"],
                           capture_output=True, text=True, cwd=work, check=True).stdout.split()  # fmt: skip
    assert all(Path(p).is_relative_to(site) for p in where), where
    toy = ["--set", "runs_dir=runs", "--set", "suite=textcraft", "--set", "policy.kind=scripted",
           "--set", "suite_args.domains=2", "--set", "suite_args.max_tier=5", "--set", "suite_args.items_per_tier=5",
           "--set", "suite_args.cross_domain_items=0", "--set", "rollout.difficulty=easy",
           "--set", "rollout.num_tasks=2", "--set", "rollout.group_size=2"]  # fmt: skip
    rao = env_dir / "bin" / "rao"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for command in ("rollout", "score"):
        out = subprocess.run([rao, command, *toy], capture_output=True, text=True, cwd=work, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
    assert (work / "runs" / "default" / "scores" / "round=0" / "scores.parquet").is_file()
