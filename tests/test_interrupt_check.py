"""A signal whose exception Python dropped still ends the command.

`rao`'s handler raises Interrupted in the main thread wherever it is; when that is inside a
finalizer (a `__del__`, a generator the garbage collector closes), Python prints the exception as
ignored and carries on. Two clean-clone test runs met it: SIGTERM while round 0 trained beside round 1's rollout
(campaign.max_staleness=1); the training went on, and the trainer's wait for round 1 raised the
lane's error (exit 1, a traceback) instead of ending in one line with 143. `interrupts.check`
raises it again at a stage's start, a training step and each wait for the other lane."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from rao_core import campaign, interrupts
from rao_core.train.stage import NoteSteps

ROOT = Path(__file__).resolve().parents[1]

FINALIZER = textwrap.dedent(
    """
    import os, signal, sys
    from rao_core import interrupts

    interrupts.install()
    interrupts.note("training of round 0, rollout of round 1 (1 of 2 trees)")

    class Dropped:
        def __del__(self):
            {body}
            for _ in range(10_000):  # the handler runs here, inside the finalizer
                pass

    Dropped()  # finalized at once: what it raises is printed as ignored, or not at all
    print("went on after the finalizer", flush=True)
    interrupts.note("training of round 0 (step 2 of 4)")  # the engine lane has ended meanwhile
    try:
        interrupts.check()
        print("check: nothing received", flush=True)
    except interrupts.Interrupted as e:
        print(f"check raised Interrupted({{e.signum}}): {{e}}", flush=True)
        print(interrupts.exit_line(e.signum), flush=True)
    """
)


def run_script(body: str) -> subprocess.CompletedProcess:
    code = FINALIZER.format(body=body)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_signal_dropped_by_a_finalizer_is_raised_again_by_check_and_not_printed():
    got = run_script("os.kill(os.getpid(), signal.SIGTERM)")
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == [
        "went on after the finalizer",
        "check raised Interrupted(15): SIGTERM during training of round 0, rollout of round 1 (1 of 2 trees)",
        # the stages when the signal came, both lanes', not the stage the command had reached since
        "interrupted (SIGTERM) during training of round 0, rollout of round 1 (1 of 2 trees): no run folder "
        "was written yet",
    ]
    assert got.stderr == ""  # no "Exception ignored in ...", no traceback


def test_other_exceptions_of_finalizers_are_still_printed():
    got = run_script("raise ValueError('a bug of the finalizer')")
    assert got.stdout.splitlines() == ["went on after the finalizer", "check: nothing received"]
    assert "Exception ignored in" in got.stderr and "ValueError: a bug of the finalizer" in got.stderr


@pytest.fixture
def received(monkeypatch):
    """This process as if `rao`'s handler had taken SIGTERM and its exception had been dropped."""
    monkeypatch.setattr(interrupts, "_received", [15])
    monkeypatch.setattr(interrupts, "_where", {"stage": "training of round 0"})


def test_the_trainers_wait_ends_with_the_signal_not_with_the_lanes_error(received):
    lane_failed = lambda: "the engine lane failed: Interrupted: SIGTERM"  # noqa: E731
    with pytest.raises(interrupts.Interrupted, match="SIGTERM during training of round 0") as e:
        campaign.wait_until(lambda: False, "round 1's rollout", 60.0, lane_failed)
    assert e.value.signum == 15


def test_a_training_step_ends_with_the_signal(received, tmp_path):
    with pytest.raises(interrupts.Interrupted):
        NoteSteps(tmp_path).on_step_end(None, SimpleNamespace(global_step=1, max_steps=4), None)


def test_without_a_signal_nothing_changes(tmp_path):
    NoteSteps(tmp_path).on_step_end(None, SimpleNamespace(global_step=1, max_steps=4), None)
    with pytest.raises(campaign.LaneStopped, match="the engine lane failed"):
        campaign.wait_until(lambda: False, "round 1's rollout", 60.0, lambda: "the engine lane failed")
