"""The project without a package registry: a lock, a folder of wheels, an install from that folder.

    .venv/bin/python scripts/offline_install.py lock                  # requirements/lock.txt from .venv
    .venv/bin/python scripts/offline_install.py wheelhouse --dir D [--python-version 3.12]
        [--platform manylinux_2_28_x86_64] [--skip "torch mlflow"] [--have freeze.txt] [--torch-index URL]
    python3 scripts/offline_install.py install --dir D [--venv .venv] [--keep torch,transformers | all]

`wheelhouse` (a connected machine) downloads the lock's wheel of every distribution `rao[dev]`
needs on the target Python and platform, leaving out the --skip names, the names a `pip freeze` of
the target lists (--have), and whatever only they need (the dependency graph is read from the
metadata of the environment running it). torch comes with its own dependencies (a CUDA build's
nvidia-* and triton), from PyPI or --torch-index.

`install` (any machine, no registry; standard library only) creates the venv with the Python that
runs it, bootstraps pip from the folder's pip wheel and installs with `--no-index`. Without --keep:
the whole lock, dependencies resolved, so the folder must be complete. With --keep the venv also
sees that Python's own site-packages (a .pth file: like --system-site-packages, and it also works
when that Python is itself a venv), keeps the named distributions (`all`: every one there) at any
version, torch and transformers only inside the window below, and installs with `--no-deps` what is
missing or at another version than the lock's, at the version a kept distribution requires where the
lock's is not one (a kept transformers checks huggingface-hub's and tokenizers' at import). Then the project, editable, with `--no-deps
--no-build-isolation` (setuptools comes from the folder), so `rao` and its `rao.suites` entry
points work.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
ALWAYS = {"pip", "setuptools"}  # pip bootstraps the venv; setuptools builds the project without isolation
# Versions a kept torch / transformers may have (lower inclusive, upper exclusive): the project pins
# torch 2.13.0 and transformers 5.20.2 and ran clean on an H200 with torch 2.11.0, transformers 5.17.0.
WINDOWS = {"torch": ("2.11", "3"), "transformers": ("5.17", "6")}


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    return version.split("+")[0]  # 2.13.0+cpu -> 2.13.0: any build of the same release


def release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.match(r"\d+(\.\d+)*", version)[0].split("."))  # 5.17.0rc1 -> (5, 17, 0)


def outside_window(name: str, version: str) -> str:
    """'' when the version is one the project runs on, else why not."""
    lo, hi = WINDOWS.get(name, ("0", "99999"))
    return "" if release(lo) <= release(version) < release(hi) else f" (outside {lo} <= v < {hi})"


def read_lock(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return {canon(n): v for n, v in (line.split("==") for line in lines if line)}


def names_in(freeze: str) -> set[str]:
    """The names a `pip freeze` lists (name==version, name @ url)."""
    lines = [line.split("#")[0].strip() for line in freeze.splitlines()]
    return {canon(re.split(r"[=@ ]", line)[0]) for line in lines if line and not line.startswith("-")}


def wheels_in(folder: Path) -> dict[str, set[str]]:
    """{name: versions} of the wheels in a folder (name-version-tags.whl)."""
    found: dict[str, set[str]] = {}
    for w in folder.glob("*.whl"):
        name, version = w.name.split("-")[:2]
        found.setdefault(canon(name), set()).add(version)
    return found


def plan(lock: dict[str, str], installed: dict[str, str], wheels: dict[str, set[str]], keep) -> dict:
    """What to do with each locked distribution: {"keep": {name: why}, "install": {name: (version,
    why)}, "absent": {name: version}, "problems": {name: why}}. keep: names kept at any version, or
    "all" (every installed one). Absent: neither installed nor in the folder (left out on purpose?)."""
    out: dict = {"keep": {}, "install": {}, "absent": {}, "problems": {}}
    for name, want in sorted(lock.items()):
        have = installed.get(name)
        has_wheel = any(public(v) == public(want) for v in wheels.get(name, ()))
        window = outside_window(name, have) if have else ""
        if have and public(have) == public(want):
            out["keep"][name] = f"{have} (as locked)"
        elif have and (keep == "all" or name in keep) and not window:
            out["keep"][name] = f"{have} (kept; the lock has {want})"
        elif has_wheel:
            out["install"][name] = (want, f"installed {have}{window}" if have else "missing")
        elif have:
            out["problems"][name] = f"{have} installed{window}, the lock has {want}, no wheel of it"
        else:
            out["absent"][name] = want
    return out


def reconcile(todo: dict, lock: dict[str, str], installed: dict[str, str], needs: dict) -> None:
    """Make `todo` (plan's) meet what the kept distributions require of the others: a kept
    transformers checks the versions of huggingface-hub, tokenizers and more when it is imported
    and refuses the lock's where its own pins differ. needs: {kept: {dep: (specifier, [versions
    of dep, installed or in the folder, that satisfy it])}} (`kept_needs` asks the venv). A dep
    whose planned version fails is kept at the machine's own version where that satisfies every
    kept one's pin, else installed at the newest wheel that does, else reported."""
    wanted: dict[str, list[tuple[str, str, set[str]]]] = {}
    for kept, deps in needs.items():
        for dep, (spec, ok) in deps.items():
            wanted.setdefault(dep, []).append((kept, spec, set(ok)))
    for dep, pins in sorted(wanted.items()):
        ok = set.intersection(*(versions for *_, versions in pins))
        planned = todo["install"][dep][0] if dep in todo["install"] else installed.get(dep)
        if dep in todo["absent"] or planned in ok:
            continue
        why = "; ".join(f"{kept} {installed.get(kept, '?')} needs {dep}{spec}" for kept, spec, _ in pins)
        have = installed.get(dep)
        if have in ok:
            todo["install"].pop(dep, None)
            todo["keep"][dep] = f"{have} (kept: {why}; the lock has {lock[dep]})"
        elif ok - {have}:
            todo["keep"].pop(dep, None)
            todo["install"][dep] = (max(ok - {have}, key=release), why)
        else:
            todo["problems"][dep] = (
                f"{why}: neither the installed {have} nor a wheel of the folder satisfies it"
            )


# Run in the venv (it sees the kept distributions): their requirements on the lock's others, with pip's
# own packaging (markers evaluated for this Python), and which candidate versions satisfy each.
KEPT_NEEDS = """
import json, sys, importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import InvalidVersion, Version
kept, candidates = json.loads(sys.argv[1])
def version(v):
    try:
        return Version(v.split("+")[0])
    except InvalidVersion:
        return None
out = {}
for name in kept:
    for r in map(Requirement, md.distribution(name).requires or []):
        dep = canonicalize_name(r.name)
        if dep not in candidates or (r.marker and not r.marker.evaluate({"extra": ""})):
            continue
        ok = [v for v in candidates[dep] if version(v) and r.specifier.contains(version(v), prereleases=True)]
        out.setdefault(name, {})[dep] = [str(r.specifier), ok]
print(json.dumps(out))
"""


def kept_needs(py: Path, kept: list[str], candidates: dict[str, list[str]]) -> dict:
    """What the kept distributions require of the lock's others, as `reconcile` reads it."""
    import json

    out = run(py, "-c", KEPT_NEEDS, json.dumps([kept, candidates]), capture_output=True)
    return {k: {d: tuple(v) for d, v in deps.items()} for k, deps in json.loads(out.stdout).items()}


def run(*cmd, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=check, text=True, **kw)


# ---- lock ---------------------------------------------------------------------------------------
def cmd_lock(a) -> None:
    freeze = run(sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable", capture_output=True)
    extras = set(read_lock(ROOT / "requirements" / "smollm2.txt"))  # installed --no-deps: not rao[dev]'s
    pins = [p for p in freeze.stdout.split() if "==" in p and not p.startswith("rao==")]
    pins = [p for p in pins if canon(p.split("==")[0]) not in extras]
    Path(a.out).write_text(
        f"# Every distribution `pip install -e .[dev]` resolved (Python {sys.version.split()[0]}), but the\n"
        "# project. `make lock` writes it from .venv; `make wheelhouse`, `make install-offline` read it.\n"
        + "".join(p + "\n" for p in sorted(pins, key=str.lower))
    )
    print(f"lock: {len(pins)} distributions -> {a.out}")


# ---- wheelhouse ---------------------------------------------------------------------------------
def platforms(tag: str) -> list[str]:
    """manylinux_2_28_x86_64 -> every manylinux tag a glibc-2.28 machine runs (pip does not expand them)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if not m:
        return [tag]
    glibc, arch = int(m[1]), m[2]
    legacy = [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"] if glibc >= 17 else []
    return [f"manylinux_2_{g}_{arch}" for g in range(glibc, 4, -1)] + legacy


def needed(skip: set[str], python_version: str) -> set[str]:
    """Distributions `rao[dev]` needs on the target Python (markers evaluated for it), from the
    metadata of the environment running this; a skipped name is cut with all that only it needs."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    dists = {canon(d.metadata["Name"]): d for d in md.distributions()}
    env = {"python_version": python_version, "python_full_version": python_version + ".0", "os_name": "posix",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}  # fmt: skip
    seen, todo = set(), [("rao", ("dev",))]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in dists:
            continue
        seen.add((name, extras))
        for r in map(Requirement, dists[name].requires or []):
            if canon(r.name) in skip:
                continue
            if r.marker and not any(r.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
                continue
            todo.append((canon(r.name), tuple(sorted(r.extras))))
    return {name for name, _ in seen} - {"rao"}


def is_lzma(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as z:
        return z.infolist()[0].compress_type == zipfile.ZIP_LZMA


def recompress(wheel: Path) -> None:
    """The same wheel with its members LZMA-compressed: pip installs it, and it is smaller."""
    tmp = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_LZMA)
    tmp.replace(wheel)


def cmd_wheelhouse(a) -> None:
    lock = read_lock(Path(a.lock))
    skip = {canon(s) for s in a.skip.replace(",", " ").split()}
    if a.have and not Path(a.have).is_file():
        sys.exit(f"wheelhouse: HAVE={a.have}: no such file (a `pip freeze` of the target's Python)")
    skip |= names_in(Path(a.have).read_text()) if a.have else set()
    version = a.python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    want = {n: v for n, v in lock.items() if n in needed(skip, version) | ALWAYS and n not in skip}
    left_out = sorted(set(lock) - set(want))
    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    tags = [t for p in a.platform.split() for t in platforms(p)]
    target = ["--only-binary=:all:", "--python-version", version, "--implementation", "cp"]
    target += [f"--platform={t}" for t in tags]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    download = [*pip, "download", "-q", *target, "-d", out]
    print(f"wheelhouse: {len(want)} of the lock's {len(lock)} distributions for Python {version} on {tags[0]} "
          f"(and older) -> {out}; left out: {' '.join(left_out) or 'nothing'}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        reqs, cons = Path(tmp, "reqs.txt"), Path(tmp, "constraints.txt")
        reqs.write_text("".join(f"{n}=={v}\n" for n, v in want.items() if n != "torch"))
        run(*download, "--no-deps", "-r", reqs)
        if "torch" in want:  # with its own dependencies (a CUDA build's libraries), the others at the lock's
            cons.write_text("".join(f"{n}=={public(v)}\n" for n, v in lock.items() if n != "torch"))
            index = ["--extra-index-url", a.torch_index] if a.torch_index else []
            run(*download, *index, "-c", cons, f"torch=={public(lock['torch'])}")
        if not left_out:  # a complete folder: the whole lock must resolve from it alone, for the target
            reqs.write_text("".join(f"{n}=={public(v)}\n" for n, v in lock.items()))
            run(*pip, "install", "-q", "--dry-run", "--ignore-installed", "--no-index", "--find-links", out,
                *target, "--target", Path(tmp, "t"), "-r", reqs)  # fmt: skip
            print("wheelhouse: the whole lock resolves from this folder alone (pip install --dry-run)")
    wheels = list(out.glob("*.whl"))
    if a.lzma:  # not pip's own: the venv's bootstrap runs pip from it through zipimport, which reads no LZMA
        for w in wheels:
            if not w.name.startswith("pip-") and not is_lzma(w):
                recompress(w)
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"wheelhouse: {len(wheels)} wheels, {size:.1f} MiB in {out}")


# ---- install ------------------------------------------------------------------------------------
def ask(python: Path, code: str):
    """The value an expression has in another interpreter."""
    return ast.literal_eval(run(python, "-c", f"print(repr({code}))", capture_output=True).stdout)


SITE_DIRS = "[p for p in __import__('sys').path if p.endswith(('site-packages', 'dist-packages'))]"
PURELIB = "__import__('sysconfig').get_paths()['purelib']"
META = "__import__('importlib.metadata').metadata"
INSTALLED = f"{{d.metadata['Name']: d.version for d in {META}.distributions()}}"
SUITES = f"sorted(e.name for e in {META}.entry_points(group='rao.suites'))"


def cmd_install(a) -> None:
    folder, venv, names = Path(a.dir), Path(a.venv), a.keep.replace(",", " ").split()
    if not folder.is_dir():
        sys.exit(f"install-offline: WHEELHOUSE={folder}: no such folder (make it with `make wheelhouse`)")
    lock = read_lock(Path(a.lock))
    keep = "all" if names == ["all"] else {canon(n) for n in names}
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    py = venv / "bin" / "python"
    if keep:  # the venv sees this Python's packages after its own (site.addsitedir: their .pth files too)
        theirs = ask(Path(sys.executable), SITE_DIRS)
        pth = "".join(f"import site; site.addsitedir({d!r})\n" for d in theirs)
        Path(ask(py, PURELIB), "_rao_keep.pth").write_text(pth)
        print(f"install-offline: {venv} also sees {', '.join(theirs)}")
    if run(py, "-c", "import pip", check=False, capture_output=True).returncode:  # pip from its own wheel
        wheel = max(folder.glob("pip-*.whl"), default=None)
        if wheel is None:
            sys.exit(f"install-offline: {venv} has no pip, {folder} no pip wheel (make wheelhouse adds one)")
        run(py, f"{wheel}/pip", "install", "-q", "--no-index", "--no-deps", wheel)
    installed, wheels = {canon(n): v for n, v in ask(py, INSTALLED).items()}, wheels_in(folder)
    todo = plan(lock, installed, wheels, keep)
    kept = [n for n, why in todo["keep"].items() if "(kept" in why]  # at another version than the lock's
    if kept:
        candidates = {
            n: sorted({*wheels.get(n, ()), *([installed[n]] if n in installed else [])}) for n in lock
        }
        reconcile(todo, lock, installed, kept_needs(py, kept, candidates))
    shown = {n: why for n, why in todo["keep"].items() if "as locked" not in why or n in WINDOWS}
    for name, why in shown.items():
        print(f"keep     {name} {why}")
    print(f"keep     {len(todo['keep']) - len(shown)} more at the lock's versions")
    missing = [f"{n}=={v}" for n, (v, why) in todo["install"].items() if why == "missing"]
    print(f"install  {len(missing)} missing: {' '.join(missing)}" if missing else "install  none missing")
    for name, (version, why) in todo["install"].items():
        if why != "missing":
            instead = "instead of the " if why.startswith("installed") else ""
            print(f"install  {name}=={version} ({instead}{why})")
    for name, why in todo["problems"].items():
        print(f"WARNING  {name}: {why}")
    if todo["absent"]:  # left out of the wheelhouse on purpose (mlflow, ray), or forgotten
        print(f"absent   {len(todo['absent'])}, not installed, no wheel: {' '.join(todo['absent'])}")
    pip = [py, "-m", "pip", "install", "-q", "--no-index", "--find-links", folder]
    if todo["install"]:  # without --keep, their dependencies are resolved from the folder too
        pins = [f"{n}=={public(v)}" for n, (v, _) in todo["install"].items()]
        run(*pip, *(["--no-deps"] if keep else []), *pins)
    run(*pip, "--no-deps", "--no-build-isolation", "-e", a.project)
    for line in run(py, "-m", "pip", "check", check=False, capture_output=True).stdout.splitlines():
        if line.split() and canon(line.split()[0]) in set(lock) | {"rao"}:  # not the other Python's own
            print(f"WARNING  pip check: {line}")
    print(f"install-offline: {venv}: {len(todo['install'])} installed, {len(todo['keep'])} kept, "
          f"{len(todo['absent'])} absent; {venv}/bin/rao with suites {', '.join(ask(py, SUITES))}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("lock", help="write the lock from this environment (pip freeze)")
    p.add_argument("--out", default=str(LOCK))
    p = sub.add_parser("wheelhouse", help="download the lock's wheels for a target Python and platform")
    p.add_argument("--dir", required=True)
    p.add_argument("--lock", default=str(LOCK))
    p.add_argument("--python-version", default="", help="e.g. 3.12 (default: this Python's)")
    p.add_argument("--platform", default="manylinux_2_28_x86_64", help="wheel tags, space-separated")
    p.add_argument("--skip", default="", help="names to leave out, with what only they need")
    p.add_argument("--have", default="", help="a `pip freeze` of the target: leave out what it lists")
    p.add_argument("--torch-index", default="", help="also look for torch in this wheel index")
    p.add_argument("--lzma", action="store_true", help="recompress the wheels (but pip's) with LZMA")
    p = sub.add_parser("install", help="create a venv and install from a wheelhouse, no registry")
    p.add_argument("--dir", required=True)
    p.add_argument("--venv", default=str(ROOT / ".venv"))
    p.add_argument("--lock", default=str(LOCK))
    p.add_argument("--keep", default="", help="names (or 'all') to keep from this Python's packages")
    p.add_argument("--project", default=str(ROOT), help="the project's source folder")
    a = ap.parse_args()
    {"lock": cmd_lock, "wheelhouse": cmd_wheelhouse, "install": cmd_install}[a.cmd](a)


if __name__ == "__main__":
    main()
