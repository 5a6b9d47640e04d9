"""rao_core/watchdog.py on its own: a command's tree (sessions of its own included) ends once the
process that started the watchdog is SIGKILLed; its exit code and signals pass through; and the
reaper ends everything its parent started, the processes already reparented away included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from rao_core.watchdog import WATCHDOG

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def parent_that_prints(body: str) -> tuple[subprocess.Popen, list[int]]:
    """A Python process running `body` (which prints a JSON list of pids, then sleeps)."""
    code = textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def gone_after_kill(proc: subprocess.Popen, pids: list[int]) -> list[int]:
    """SIGKILL `proc`; the pids still alive 10 s later."""
    procs = [psutil.Process(p) for p in pids]
    proc.kill()
    proc.wait()
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        p.kill()
    return [p.pid for p in alive]


def test_the_command_and_all_under_it_end_with_the_parent():
    proc, pids = parent_that_prints(f"""
        import json, os, subprocess, sys, time
        cmd = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen({SLEEPER!r}, start_new_session=True); time.sleep(600)"]
        dog = subprocess.Popen([sys.executable, {str(WATCHDOG)!r}, str(os.getpid()), "--grace", "2", "--", *cmd], start_new_session=True)
        time.sleep(1.5)
        from rao_core.watchdog import descendants
        print(json.dumps([dog.pid, *descendants(dog.pid)]), flush=True)
        time.sleep(600)
    """)
    assert len(pids) == 3  # the watchdog, its command, and the sleeper in a session of its own
    assert gone_after_kill(proc, pids) == []


def test_exit_codes_and_signals_pass_through():
    me = str(os.getpid())
    done = subprocess.run([sys.executable, str(WATCHDOG), me, "--", sys.executable, "-c", "exit(3)"])
    assert done.returncode == 3
    dog = subprocess.Popen([sys.executable, str(WATCHDOG), me, "--", *SLEEPER])
    while not psutil.Process(dog.pid).children():
        time.sleep(0.05)
    dog.send_signal(signal.SIGTERM)
    assert dog.wait(timeout=10) == -signal.SIGTERM  # passed on; the command died of it, so did the watchdog
    dog = subprocess.Popen([sys.executable, str(WATCHDOG), me, "--", *SLEEPER])
    while not (command := psutil.Process(dog.pid).children()):
        time.sleep(0.05)
    command[0].kill()
    assert dog.wait(timeout=10) == -signal.SIGKILL  # a command killed outright: the same for its watchdog


def test_the_reaper_ends_what_its_parent_started_even_reparented():
    proc, pids = parent_that_prints(f"""
        import json, subprocess, sys, time
        from rao_core import watchdog
        watchdog.start_reaper()
        own = subprocess.Popen({SLEEPER!r}, start_new_session=True)
        orphan = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; print(subprocess.Popen({SLEEPER!r}).pid, flush=True); time.sleep(1.5)"], stdout=subprocess.PIPE, text=True)
        orphaned = int(orphan.stdout.readline())
        orphan.wait()  # 1.5 s: the reaper's list has its child, which is then reparented away
        print(json.dumps([own.pid, orphaned]), flush=True)
        time.sleep(600)
    """)
    assert gone_after_kill(proc, pids) == []


def test_a_killed_commands_own_temporary_folder_goes_with_it(tmp_path):
    """start_reaper gives the process a temporary folder of its own (TMPDIR for what it starts);
    after a SIGKILL the reaper ends its children, then deletes the folder. What should outlive the
    command stays where it was: Ray's session logs and torch's compile cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import json, os, subprocess, sys, tempfile, time
        from rao_core import watchdog
        watchdog.start_reaper()
        child = subprocess.Popen([sys.executable, "-c", "import tempfile, time; tempfile.mkstemp(); time.sleep(600)"])
        kept = tempfile.mkdtemp()  # a folder a `finally` would have removed
        while len(os.listdir(tempfile.gettempdir())) < 2:  # the child's file, too
            time.sleep(0.05)
        print(json.dumps([child.pid, tempfile.gettempdir(), os.environ["RAY_TMPDIR"],
                          os.environ["TORCHINDUCTOR_CACHE_DIR"]]), flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, env={**env, "TMPDIR": str(tmp_path)})  # fmt: skip
    child, own, ray_dir, inductor = json.loads(proc.stdout.readline())
    assert os.path.dirname(own) == str(tmp_path) and os.path.basename(own).startswith(f"rao-{proc.pid}-")
    assert (ray_dir, os.path.dirname(inductor)) == (str(tmp_path), str(tmp_path))
    assert gone_after_kill(proc, [child]) == []
    deadline = time.monotonic() + 10
    while os.path.exists(own) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(own)


def test_an_interrupted_command_deletes_its_folder_and_ends_its_reaper(tmp_path):
    """kill_descendants, the end of an interrupt: the children end, then the command's own folder
    goes and its reaper with it, and TMPDIR is what it was; nothing is left when it returns."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, os, subprocess, sys, tempfile
        from rao_core import interrupts, watchdog
        watchdog.start_reaper()
        own, reaper = tempfile.gettempdir(), watchdog.reapers()[0]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        ended = interrupts.kill_descendants()
        print(json.dumps([own, reaper, child.pid, ended, os.environ["TMPDIR"], tempfile.gettempdir()]))
    """)], capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=60)  # fmt: skip
    own, reaper, child, ended, tmpdir, gettempdir = json.loads(out.stdout)
    assert ended == [child] and not psutil.pid_exists(reaper) and not os.path.exists(own)
    assert tmpdir == gettempdir == str(tmp_path) and os.listdir(tmp_path) == []


def test_what_starts_just_before_a_kill_goes_too():
    """A child started after the reaper's last look (within POLL_S of the SIGKILL) is in no list
    once reparented: its TMPDIR, the command's own folder, finds it."""
    proc, pids = parent_that_prints(f"""
        import json, subprocess, time
        from rao_core import watchdog
        watchdog.start_reaper()
        time.sleep(2)  # the reaper runs and has looked
        late = [subprocess.Popen({SLEEPER!r}).pid for _ in range(3)]
        print(json.dumps(late), flush=True)
        time.sleep(600)
    """)
    assert gone_after_kill(proc, pids) == []
