"""A new run folder's MLflow store is a copy of an empty one (rao_core/tracking_store.py): the same
schema, migrations and Default experiment MLflow itself creates, and MLflow's own creation when
the copy cannot be made."""

from __future__ import annotations

import contextlib
import sqlite3

import mlflow.store.db.utils
import pytest
from mlflow.tracking import MlflowClient

from rao_core.run import load_config
from rao_core.tracking import Tracker
from rao_core.tracking_store import template_path


def schema(db) -> tuple[list, list]:
    """The store's tables and indexes (their SQL), its migration, and its Default experiment."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        # each statement's lines, sorted: MLflow's migrations order a table's constraints
        # differently from one store they create to the next (a set's order)
        sql = sorted(
            (kind, name, sorted(line.strip().rstrip(",") for line in (text or "").splitlines()))
            for kind, name, text in con.execute("SELECT type, name, sql FROM sqlite_master")
        )
        rows = [
            con.execute("SELECT version_num FROM alembic_version").fetchall(),
            con.execute(
                "SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments WHERE experiment_id = 0"
            ).fetchall(),
        ]
    return sql, rows


def campaign(runs_dir) -> Tracker:
    """A campaign's tracker on `runs_dir`, its run made (the first store access of a command)."""
    tracker = Tracker.of(load_config(overrides=[f"runs_dir={runs_dir}"]))
    run_id = tracker.campaign_run_id()
    assert MlflowClient(tracker.uri).get_run(run_id).info.run_name == "default"
    return tracker


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # where MLflow puts the Default experiment's artifacts
    return tmp_path / "cache"


def test_a_seeded_store_is_the_store_mlflow_creates(tmp_path, cache, monkeypatch):
    campaign(tmp_path / "first")  # makes the template (MLflow's migrations, once), then copies it
    assert template_path().is_file() and template_path().is_relative_to(cache)

    def migrate(engine):
        raise AssertionError("MLflow migrated a store that was seeded")

    with monkeypatch.context() as m:  # the next new folder: a copy, which MLflow only opens
        m.setattr(mlflow.store.db.utils, "_initialize_tables", migrate)
        campaign(tmp_path / "second")
    own = tmp_path / "own.db"
    MlflowClient(tracking_uri=f"sqlite:///{own}").search_experiments()
    assert schema(tmp_path / "second" / "mlflow.db") == schema(own)
    assert not list((tmp_path / "second").glob(".tmp-mlflow.db-*"))


def test_mlflow_creates_the_store_when_no_copy_can_be_made(tmp_path, cache, monkeypatch):
    cache.write_text("a file where the cache folder would be")  # the template cannot be written
    campaign(tmp_path / "unwritable")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other-cache"))
    monkeypatch.setenv("RAO_MLFLOW_TEMPLATE", "0")  # turned off
    campaign(tmp_path / "off")
    assert not (tmp_path / "other-cache").exists()
    assert schema(tmp_path / "unwritable" / "mlflow.db")[1] == schema(tmp_path / "off" / "mlflow.db")[1]
    assert not list((tmp_path / "unwritable").glob(".tmp-mlflow.db-*"))
