"""MLflow tracking when several campaigns start at once on a fresh machine (real MLflow on SQLite)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from mlflow.tracking import MlflowClient

from rao_core.run import load_config
from rao_core.tracking import Tracker

pytestmark = pytest.mark.slow  # four interpreters importing MLflow

CAMPAIGN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rao_core.tracking import Tracker
    from rao_core.run import load_config

    runs, name, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    cfg = load_config(overrides=[f"runs_dir={runs}", f"run_name={name}"])
    (runs / f"{name}.ready").touch()
    while len(list(runs.glob("*.ready"))) < n:  # all start on the fresh store at once
        time.sleep(0.01)
    Tracker.of(cfg).campaign_run_id()
    """
)


def test_campaigns_started_together_share_a_fresh_store(tmp_path):
    """Four campaigns' first tracking call at the same moment on a store that does not exist yet:
    all four get their run, in one experiment (they raced on the SQLite migration before)."""
    names = [f"c{i}" for i in range(4)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CAMPAIGN, str(tmp_path), name, str(len(names))],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in names
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    cfg = load_config(overrides=[f"runs_dir={tmp_path}"])
    client = MlflowClient(Tracker.of(cfg).uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["rao.run"] for r in runs) == names
