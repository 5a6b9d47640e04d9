"""`rao train --check` refuses, one line each, what would fail later and can be seen before any
work: a scripted policy or a warm start without an expert, demonstrations that do not exist, more
held-out or rollout tasks than the suite has, task rows with undeclared difficulties; and it warns
about suite-specific settings the suite does not read. The synthesize stage checks the same rows."""

from __future__ import annotations

import uuid

import pytest

from flows.cli import main
from rao_core.envs.checks import RunCheckError, check_tasks
from rao_core.envs.suites import open_suite
from rao_core.run import load_config
from tests.envs.test_suite_plugins import USER_SUITE

ECHO = "suite=usertasks.echo:EchoSuite"
# The same suite writing a difficulty it does not declare.
MISLABELLED = USER_SUITE.replace('"difficulty": self.difficulties[i // 2 % 2]', '"difficulty": "huge"')


def mislabelled(site) -> str:
    """A module of its own per test (a package imported by an earlier test keeps its old path)."""
    name = f"mislabelled_{uuid.uuid4().hex[:8]}"
    (site / f"{name}.py").write_text(MISLABELLED)
    return name


def check(tmp_path, capsys, *overrides: str) -> tuple[int, str]:
    rc = main(
        ["train", "--check", "--set", f"runs_dir={tmp_path}", *(a for o in overrides for a in ("--set", o))]
    )
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ((ECHO, "policy.kind=scripted"), "policy.kind: 'scripted': EchoSuite has no scripted expert"),
        ((ECHO, "policy.model=warmstart"), "policy.model: 'warmstart': EchoSuite has no scripted expert to learn from"),
        ((ECHO, "policy.model=warmstart", "warmstart.demonstrations=/no/such/trees"),
         "warmstart.demonstrations: '/no/such/trees': no such file or folder"),
        ((ECHO, "eval.num_tasks=500"), "eval.num_tasks: 500: more than the 1 holdout tasks of difficulty 'big'"),
        ((ECHO, "rollout.num_tasks=50"), "rollout.num_tasks: 50: more than the 3 fit tasks"),
        (("suite=usertasks.mislabelled:EchoSuite",), "fit tasks have difficulty 'huge', which EchoSuite does not declare"),
    ],
)  # fmt: skip
def test_check_refuses_in_one_line(user_pkg, tmp_path, capsys, overrides, message):
    module = mislabelled(user_pkg)
    rc, err = check(tmp_path, capsys, *(o.replace("usertasks.mislabelled", module) for o in overrides))
    assert rc == 2 and err.startswith("config error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "default").exists()  # --check wrote nothing into the run folder


def test_check_passes_with_demonstrations_and_warns_about_settings_the_suite_ignores(
    user_pkg, tmp_path, capsys
):
    demos = tmp_path / "demos.parquet"
    demos.write_bytes(b"")
    rc, err = check(tmp_path, capsys, ECHO, "policy.model=warmstart", f"warmstart.demonstrations={demos}",
                    "warmstart.flat_tiers=[1]", "warmstart.root_inline_rate=0.3")  # fmt: skip
    assert rc == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert [w.split("=")[0] for w in warnings] == [
        "warning: warmstart.flat_tiers",
        "warning: warmstart.root_inline_rate",
    ]
    assert "does nothing for suite EchoSuite, which reads none of them" in warnings[0]
    rc, err = check(
        tmp_path, capsys, "suite=examples.filecount.suite:FileCount", "warmstart.root_inline_rate=0.3"
    )
    assert rc == 0 and "does nothing" not in err  # FileCount's demonstrator reads it (Suite.reads)


def test_the_synthesize_stage_checks_the_rows_it_wrote(user_pkg, tmp_path):
    """Undeclared labels are refused; too few tasks, outside --check, are a warning."""
    cfg = load_config(overrides=[f"runs_dir={tmp_path}", f"suite={mislabelled(user_pkg)}:EchoSuite"])
    with pytest.raises(RunCheckError, match="does not declare"):
        check_tasks(open_suite(cfg), cfg.rollout, cfg.eval, strict=False)
    cfg = load_config(overrides=[f"runs_dir={tmp_path / 'b'}", ECHO, "eval.num_tasks=3"])
    (warning,) = check_tasks(open_suite(cfg), cfg.rollout, cfg.eval, strict=False)
    assert (
        warning.startswith("warning: eval.num_tasks: 3: more than the 1 holdout tasks")
        and "draws what" in warning
    )
