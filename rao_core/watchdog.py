"""Runs a command as a child and ends it, with everything under it, once the process that started
the watchdog is gone, even by SIGKILL.

    python rao_core/watchdog.py PARENT_PID [--kill] [--grace S] [--remove DIR] -- command...
    python rao_core/watchdog.py PARENT_PID --reap [--grace S] [--remove DIR]

Why: the long-lived helpers a `rao` command starts (the temporary Prefect server, a vLLM server, a
training launcher and its ranks) run in sessions of their own, so that a terminal's Ctrl-C reaches
them only through the command, which stops them in order. A `finally` cannot run after SIGKILL
(a scheduler's, the OOM killer's), so without this they would live on, holding memory, ports and
the caller's output pipe. The watchdog checks once every half second whether its parent is still
PARENT_PID; when it is not, it sends SIGTERM to the command's whole process tree (SIGKILL with
`--kill`, for launchers whose ranks print tracebacks on SIGTERM), then SIGKILL to whatever is left
after `--grace` seconds, and deletes the folder named by `--remove`, if any (a vLLM server's,
whose sockets need a short path, so it may lie outside the command's own folder). SIGTERM or
SIGINT to the watchdog is passed on to the command, and the watchdog ends as its command did (its
exit code, or the same signal).

With `--reap` there is no command: the watchdog keeps a list of every process under PARENT_PID,
and once that process is gone it ends them all. A `rao` command starts one (`start_reaper`), which
covers what the command's libraries start outside any session of ours (a local Ray instance's
agents outlive its driver's SIGKILL otherwise). `--remove DIR` then deletes DIR: the command's own
temporary folder (`own_tempdir`), where it and all it starts keep their temporary files. All of
them have DIR as their TMPDIR, so the reaper also ends those that started too late for its list.

Only the standard library is used: it also runs under the vLLM environment's Python, where
rao_core is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLL_S = 0.5
WATCHDOG = Path(__file__)  # run as a script: `python WATCHDOG PARENT_PID -- command...`


def children(pid: int) -> list[int]:
    """The processes `pid` started that still run (and are still its children)."""
    found = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in threads:  # each thread's children (Linux's CONFIG_PROC_CHILDREN)
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, whatever its session (torchrun's ranks have their own)."""
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def started(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot): tells a process from a later one given its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])  # the name may hold spaces and parens


def end(pids: dict[int, int | None], sig: int, grace_s: float) -> None:
    """`sig` to each process (pid: its start time), then SIGKILL to those alive after `grace_s`."""

    def signal_all(s: int) -> None:
        for pid, t in pids.items():
            if t is not None and started(pid) == t:  # the same process, not a reused pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, s)

    signal_all(sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(started(p) == t for p, t in pids.items()):
        time.sleep(0.1)
    signal_all(signal.SIGKILL)


def tree(roots: list[int]) -> dict[int, int | None]:
    """The roots and every process under them, each with its start time."""
    pids = [*roots, *(d for r in roots for d in descendants(r))]
    return {pid: started(pid) for pid in pids if pid != os.getpid()}


def end_tree(child: subprocess.Popen, sig: int, grace_s: float) -> None:
    """`sig` to the child and all under it, then SIGKILL to whatever outlives `grace_s`."""
    end(tree([child.pid]), sig, grace_s)
    child.wait()


def reap(parent: int, grace_s: float, remove: str | None = None) -> None:
    """Keep a list of the processes under `parent`; once it is gone, end them all, then delete
    `remove`. A process reparented when its parent died is no longer under `parent`: the list
    from just before finds it."""
    known: dict[int, int | None] = {}
    folders = [remove] if remove else []  # and those of the watchdogs under it (a vLLM server's)
    while os.getppid() == parent:
        now = tree([parent])
        folders += [f for pid in now if pid not in known for f in removes_of(pid)]
        known = {**{p: t for p, t in known.items() if started(p) == t}, **now}
        time.sleep(POLL_S)
    # what started within POLL_S of the end (or before this reaper's first look) and was reparented
    # at once is in no list: it still has the parent's own folder as its TMPDIR
    late = using_tempdir(remove) if remove else []
    end({**tree(late), **tree(list(known))}, signal.SIGTERM, grace_s)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def using_tempdir(folder: str) -> list[int]:
    """The processes whose TMPDIR is `folder` (a command's own folder: all it starts inherit it)."""
    entry = f"TMPDIR={folder}".encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def removes_of(pid: int) -> list[str]:
    """The folder a watchdog was told to delete (`--remove`), if `pid` is one: the reaper may end
    that watchdog before it could."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:
        return []
    if str(WATCHDOG) not in argv or "--remove" not in argv[:-1]:
        return []
    return [argv[argv.index("--remove") + 1]]


def exit_like(code: int) -> None:
    """End this process as the child ended: its exit code, or the signal that killed it."""
    if code < 0:
        with contextlib.suppress(OSError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="watchdog.py", description=__doc__.split("\n")[0])
    p.add_argument("parent", type=int, help="the pid whose end ends the command")
    p.add_argument("--kill", action="store_true", help="SIGKILL the tree rather than SIGTERM first")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--reap", action="store_true", help="no command: end all under the parent once it is gone")
    p.add_argument(
        "--remove", metavar="DIR", help="once the parent is gone and all ended: delete this folder"
    )
    a = p.parse_args(argv[:split])
    if a.reap:
        return reap(a.parent, a.grace, a.remove)
    child = subprocess.Popen(argv[split + 1 :])

    def forward(signum, frame):
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while child.poll() is None:
        if os.getppid() != a.parent:  # reparented: the parent is gone
            end_tree(child, signal.SIGKILL if a.kill else signal.SIGTERM, a.grace)
            break
        time.sleep(POLL_S)
    code = child.wait()
    if a.remove and os.getppid() != a.parent:  # (while the parent lives, the folder is its own)
        shutil.rmtree(a.remove, ignore_errors=True)
    exit_like(code)


_reaper: list[int] = []  # this process's reaper, once started
_folder: list = []  # this process's own temporary folder, once made, and the TMPDIR before it


def reapers() -> list[int]:
    """This process's reaper (none before `start_reaper`): what ends the rest must spare it."""
    return list(_reaper)


def lasting_dirs() -> dict[str, str]:
    """Where what should outlive a command goes, pinned before TMPDIR moves to a folder the
    command's end deletes: a local Ray instance's session logs (Ray's own default, /tmp/ray) and
    torch's compile cache (its default, under the temporary folder)."""
    user = "user"
    with contextlib.suppress(Exception):  # (no passwd entry in some containers)
        user = getpass.getuser()
    return {
        "RAY_TMPDIR": os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp",
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"),
    }


def own_tempdir() -> str:
    """A temporary folder of this process's own, TMPDIR for it and all it starts (vLLM's and
    torchrun's files, multiprocessing's, a bench's work folder): its reaper deletes it once the
    process is gone, so even a SIGKILL leaves nothing in the system's temporary folder."""
    os.environ.update(lasting_dirs())
    folder = tempfile.mkdtemp(prefix=f"rao-{os.getpid()}-")
    _folder[:] = [folder, os.environ.get("TMPDIR")]
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    return folder


def stop_reaper() -> None:
    """The end of an interrupt, once every process this one started was ended: delete this
    process's own temporary folder and end its reaper, so that nothing is left when the command
    returns. TMPDIR is again what it was before `start_reaper`."""
    for pid in _reaper:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if _folder:
        folder, before = _folder
        shutil.rmtree(folder, ignore_errors=True)
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        tempfile.tempdir = None
    _reaper.clear()
    _folder.clear()


def start_reaper() -> None:
    """One reaper for this process (`--reap`), in a session of its own so that a SIGKILL to this
    process's group spares it, and holding none of this process's pipes. Spawned without a Popen,
    whose finalizer would warn that it still runs: it is meant to outlive this process. It also
    deletes this process's own temporary folder (`own_tempdir`), made here."""
    with contextlib.suppress(ChildProcessError):  # (already waited for elsewhere: start another)
        if _reaper and os.waitpid(_reaper[0], os.WNOHANG) == (0, 0):
            return  # already running
    null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    argv = [sys.executable, str(WATCHDOG), str(os.getpid()), "--reap", "--grace", "3"]
    argv += ["--remove", _folder[0] if _folder else own_tempdir()]
    _reaper[:] = [os.posix_spawn(sys.executable, argv, os.environ, file_actions=null, setsid=True)]


if __name__ == "__main__":
    main()
