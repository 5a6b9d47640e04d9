"""scripts/offline_install.py: the lock, the plan of a keep install, and an install with no index."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "offline_install.py"
_spec = importlib.util.spec_from_file_location("offline_install", SCRIPT)
oi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oi)

LOCK = {
    "torch": "2.13.0+cpu",
    "transformers": "5.20.2",
    "numpy": "2.4.6",
    "six": "1.17.0",
    "mlflow": "3.17.2",
}
WHEELS = {name: {version} for name, version in LOCK.items() if name != "mlflow"}  # mlflow left out


def test_the_lock_pins_every_dependency_pyproject_pins_at_its_version():
    lock = oi.read_lock(oi.LOCK)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [
        *project["dependencies"],
        *(p for extra in project["optional-dependencies"].values() for p in extra),
    ]
    for pin in (p.split(";")[0].strip() for p in pins if "==" in p):
        name, version = pin.split("==")
        assert oi.public(lock[oi.canon(name.split("[")[0])]) == version, (pin, "run `make lock`")
    assert "rao" not in lock and {"pip", "setuptools"} <= set(lock)


def test_a_keep_machine_keeps_torch_and_a_transformers_inside_the_window():
    installed = {"torch": "2.11.0+cu130", "transformers": "5.17.0", "numpy": "2.5.2"}
    todo = oi.plan(LOCK, installed, WHEELS, keep={"torch", "transformers"})
    assert set(todo["keep"]) == {"torch", "transformers"}
    assert todo["install"]["numpy"] == ("2.4.6", "installed 2.5.2")  # a wrong version, not kept: the lock's
    assert todo["install"]["six"] == ("1.17.0", "missing")
    assert todo["absent"] == {"mlflow": "3.17.2"} and todo["problems"] == {}


def test_keep_all_keeps_every_installed_version_and_the_same_release_of_another_build():
    installed = {"torch": "2.13.0+cu130", "transformers": "5.20.2", "numpy": "2.5.2", "six": "1.17.0"}
    todo = oi.plan(LOCK, installed, WHEELS, keep="all")
    assert todo["keep"]["torch"] == "2.13.0+cu130 (as locked)"
    assert todo["keep"]["numpy"].startswith("2.5.2 (kept")
    assert todo["install"] == {} and set(todo["absent"]) == {"mlflow"}


def test_a_transformers_outside_the_window_is_replaced_or_reported():
    installed = {"torch": "2.11.0", "transformers": "4.57.1"}
    todo = oi.plan(LOCK, installed, WHEELS, keep={"torch", "transformers"})
    version, why = todo["install"]["transformers"]
    assert version == "5.20.2" and "4.57.1 (outside 5.17 <= v < 6)" in why
    no_wheel = {n: v for n, v in WHEELS.items() if n != "transformers"}
    todo = oi.plan(LOCK, installed, no_wheel, keep="all")
    assert "outside 5.17 <= v < 6" in todo["problems"]["transformers"]
    assert "transformers" not in todo["keep"] and todo["keep"]["torch"].startswith("2.11.0 (kept")
    old_torch = oi.plan(LOCK, {"torch": "2.5.1"}, {}, keep={"torch"})
    assert "outside 2.11 <= v < 3" in old_torch["problems"]["torch"]


def test_manylinux_tags_expand_to_the_older_glibcs_and_the_graph_cuts_what_only_a_skip_needs():
    tags = oi.platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and {"manylinux_2_17_x86_64", "manylinux2014_x86_64"} <= set(
        tags
    )
    assert "manylinux_2_29_x86_64" not in tags and oi.platforms("any") == ["any"]
    every = oi.needed(set(), "3.12")
    assert {"torch", "sympy", "transformers", "mlflow", "scipy", "pytest"} <= every
    no_torch, no_mlflow = oi.needed({"torch"}, "3.12"), oi.needed({"mlflow"}, "3.12")
    assert "torch" not in no_torch and "sympy" not in no_torch and "transformers" in no_torch
    assert "mlflow-skinny" not in no_mlflow and "scipy" not in no_mlflow and "duckdb" in no_mlflow


@pytest.mark.slow
def test_install_offline_keeps_what_the_python_has_and_installs_the_rest_with_no_index(tmp_path):
    """A small wheelhouse made by the script from PyPI (setuptools recompressed with LZMA), then an
    install from it alone into a fresh venv made by a Python that "has" torch and transformers 5.17.0
    (their metadata) and a wrong toml: the project builds with the folder's setuptools."""
    real = oi.read_lock(oi.LOCK)
    names = ["torch", "transformers", "toml", "six", "text-unidecode", "pip", "setuptools", "mlflow"]
    lock = tmp_path / "lock.txt"
    lock.write_text("".join(f"{n}=={real[n]}\n" for n in names))
    wheels, skip = tmp_path / "wheels", "torch transformers mlflow"
    cmd = [sys.executable, SCRIPT, "wheelhouse", "--dir", wheels, "--lock", lock, "--skip", skip, "--lzma"]
    subprocess.run(cmd, check=True, capture_output=True)
    assert set(oi.wheels_in(wheels)) == {"toml", "six", "text-unidecode", "pip", "setuptools"}
    assert oi.is_lzma(next(wheels.glob("setuptools-*.whl"))) and not oi.is_lzma(
        next(wheels.glob("pip-*.whl"))
    )

    system = tmp_path / "system"  # the machine's Python, with what it already has
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", system], check=True)
    site = next(system.glob("lib/python3*/site-packages"))
    for name, version in [("torch", real["torch"]), ("transformers", "5.17.0"), ("toml", "0.9.0")]:
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    src = tmp_path / "src"  # the project, copied: the editable install writes its metadata beside it
    for name in ("rao_core", "flows", "tasks", "sql"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    out = subprocess.run(
        [system / "bin" / "python", SCRIPT, "install", "--dir", wheels, "--venv", venv, "--lock", lock,
         "--keep", "torch,transformers", "--project", src],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "keep     transformers 5.17.0 (kept; the lock has 5.20.2)" in out.stdout
    assert "install  toml==0.10.2 (instead of the installed 0.9.0)" in out.stdout
    assert "absent   1, not installed, no wheel: mlflow" in out.stdout
    py = venv / "bin" / "python"
    probe = (
        "import importlib.metadata as m, rao_core; "
        "print([m.version(n) for n in ('torch', 'transformers', 'toml', 'six', 'pip')], rao_core.__file__, "
        "sorted(e.name for e in m.entry_points(group='rao.suites')))"
    )
    seen = subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    versions = [real["torch"], "5.17.0", real["toml"], real["six"], real["pip"]]
    assert seen.startswith(str(versions)), seen
    assert str(src / "rao_core") in seen and "'textcraft'" in seen
    assert (venv / "bin" / "rao").is_file()


def test_a_kept_transformers_gets_the_hub_and_tokenizers_its_own_pins_accept(tmp_path):
    """Issue 51, item 8: a kept transformers 5.17.0 whose metadata pins huggingface-hub and
    tokenizers below the lock's: the machine's own copy is kept where it satisfies the pin, a
    wheel of the folder that does is installed, and a pin nothing satisfies is reported. Its
    requirements are read as the install reads them (KEPT_NEEDS, run by a Python with pip)."""
    site = tmp_path / "site"
    info = site / "transformers-5.17.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: transformers\nVersion: 5.17.0\n"
        "Requires-Dist: huggingface-hub<2.0,>=1.3.0\nRequires-Dist: tokenizers<=0.22.2,>=0.22.0\n"
        "Requires-Dist: safetensors>=0.4.3\nRequires-Dist: numpy>=1.17\n"
        'Requires-Dist: accelerate>=1.1.0; extra == "torch"\n'
    )
    lock = {**LOCK, "huggingface-hub": "1.40.0", "tokenizers": "0.23.1", "safetensors": "0.7.0"}
    installed = {
        "torch": "2.11.0",
        "transformers": "5.17.0",
        "huggingface-hub": "1.33.0",
        "tokenizers": "0.22.1",
    }
    wheels = {
        **WHEELS,
        "huggingface-hub": {"1.40.0"},
        "tokenizers": {"0.23.1", "0.22.2"},
        "safetensors": {"0.7.0"},
    }
    todo = oi.plan(lock, installed, wheels, keep={"torch", "transformers"})
    assert todo["install"]["tokenizers"] == ("0.23.1", "installed 0.22.1")  # the lock's, at first
    candidates = {n: sorted({*wheels.get(n, ()), *([installed[n]] if n in installed else [])}) for n in lock}
    env = {**os.environ, "PYTHONPATH": str(site)}  # the fake transformers first on the path
    out = subprocess.run(
        [sys.executable, "-c", oi.KEPT_NEEDS, json.dumps([["transformers"], candidates])],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    needs = {k: {d: tuple(v) for d, v in deps.items()} for k, deps in json.loads(out.stdout).items()}
    assert needs["transformers"]["tokenizers"] == ("<=0.22.2,>=0.22.0", ["0.22.1", "0.22.2"])
    assert "accelerate" not in needs["transformers"]  # an extra's requirement
    oi.reconcile(todo, lock, installed, needs)
    assert todo["keep"]["tokenizers"].startswith("0.22.1 (kept: transformers 5.17.0 needs tokenizers<=0.22.2")
    assert "tokenizers" not in todo["install"]
    assert todo["install"]["huggingface-hub"] == ("1.40.0", "installed 1.33.0")  # the lock's is < 2.0: kept
    assert todo["install"]["safetensors"] == ("0.7.0", "missing") and todo["problems"] == {}

    installed["tokenizers"] = "0.21.0"  # the machine's copy too old: the folder's 0.22.2 instead
    todo = oi.plan(lock, installed, wheels, keep={"torch", "transformers"})
    oi.reconcile(todo, lock, installed, {"transformers": {"tokenizers": ("<=0.22.2,>=0.22.0", ["0.22.2"])}})
    assert todo["install"]["tokenizers"] == (
        "0.22.2",
        "transformers 5.17.0 needs tokenizers<=0.22.2,>=0.22.0",
    )
    todo = oi.plan(lock, installed, wheels, keep={"torch", "transformers"})
    oi.reconcile(todo, lock, installed, {"transformers": {"tokenizers": ("<0.22", [])}})
    assert "neither the installed 0.21.0 nor a wheel of the folder" in todo["problems"]["tokenizers"]
