"""A new run folder's MLflow store, copied from an empty one instead of created.

MLflow creates a SQLite store by running its schema migrations, in the first command of every new
run folder (and in every test that makes one): that first tracking call took 2.6 s of CPU here. An
empty store made once per MLflow version and kept in the user's cache is copied into place in a
millisecond, and MLflow opens it as any existing store (it checks the schema is current): 1.5 s
(bench/tracking_store_bench.py). `RAO_MLFLOW_TEMPLATE=0` turns this off.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from rao_core.store.files import atomic_write


def template_path() -> Path:
    """The empty store of this MLflow version, in the user's cache."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rao" / f"mlflow-{importlib.metadata.version('mlflow')}-empty.db"


def _backup(src: Path, dst: Path) -> None:
    """A consistent copy of SQLite file `src`, whatever connections to it are still open."""
    with contextlib.closing(sqlite3.connect(src)) as a, contextlib.closing(sqlite3.connect(dst)) as b:
        a.backup(b)


def _make_template(path: Path) -> None:
    """Let MLflow create and migrate a store in a scratch folder, then copy it to `path`."""
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as scratch:
        made = Path(scratch) / "made.db"
        MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments(max_results=1)
        atomic_write(path, lambda tmp: _backup(made, tmp))


def _fill(store: Path, template: Path) -> None:
    """`store` as a copy of the template, its Default experiment what MLflow would give it here
    and now."""
    shutil.copyfile(template, store)
    now = int(time.time() * 1000)
    with contextlib.closing(sqlite3.connect(store)) as con, con:
        con.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
            "WHERE experiment_id = 0",
            (str(Path("mlruns").resolve() / "0"), now, now),
        )


def seed_store(db: Path) -> bool:
    """Put an empty, migrated MLflow store at `db` (which does not exist yet); False when it cannot
    (the cache unwritable, say) or is turned off, and MLflow then creates the store itself. The
    caller holds the runs folder's store lock."""
    if os.environ.get("RAO_MLFLOW_TEMPLATE", "1") == "0":
        return False
    try:
        template = template_path()
        if not template.is_file():
            _make_template(template)
        atomic_write(db, lambda tmp: _fill(tmp, template))
    except Exception:  # whatever failed, MLflow creates the store itself (and says so if it cannot)
        return False
    return True
