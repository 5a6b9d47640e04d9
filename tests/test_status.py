"""`rao status` of a run folder reports the run's own rounds, whatever this command's defaults."""

from __future__ import annotations

from flows.cli import main
from rao_core.run import Run, load_config
from rao_core.stages.synthesize import prepare
from tests.conftest import TOY


def test_status_lists_the_runs_own_rounds(tmp_path, capsys):
    cfg = load_config(overrides=[f"runs_dir={tmp_path}", *TOY, "run_name=mine", "campaign.rounds=3"])
    prepare(Run(cfg))  # saves the run's config.yaml, as every stage does
    assert main(["status", "--set", f"runs_dir={tmp_path}", "--set", "run_name=mine"]) == 0
    out = capsys.readouterr().out
    assert "0 of 3 rounds complete" in out
    rows = [
        line
        for line in out.splitlines()
        if line.strip().startswith("│") and line.split("│")[1].strip().isdigit()
    ]
    assert [line.split("│")[1].strip() for line in rows] == ["0", "1", "2"]
