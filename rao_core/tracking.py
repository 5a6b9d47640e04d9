"""MLflow tracking: one parent run per training campaign, one nested run per round, and what each
round logs there (once: a marker under <run>/logged/ makes a resumed campaign skip it).

Uses MlflowClient with explicit run ids (no fluent "active run" state), so stages may log from any
thread or process, and a resumed campaign continues the same runs: their ids are kept in
`runs/<run>/tracking.json`. The default backend is SQLite with a local artifact folder.

A `Tracker` is built once from a run's configuration (`Tracker.of(cfg)`, or `run.tracker`) and
holds only what tracking needs from it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rao_core.config import RunConfig, to_dict
from rao_core.layout import RunLayout
from rao_core.store.files import write_json
from rao_core.store.parquet import is_complete, read_meta
from rao_core.tracking_store import seed_store


def metric_name(key: str) -> str:
    """MLflow accepts only alphanumerics and `_ - . : /` and spaces in metric names."""
    return re.sub(r"[^0-9A-Za-z_\-.:/ ]", "_", key)


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """{'success': {'easy': 0.9}} -> {'success/easy': 0.9}; drops non-numbers and NaN."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}/"))
        elif isinstance(value, bool | int | float) and not (isinstance(value, float) and math.isnan(value)):
            out[metric_name(name)] = float(value)
    return out


@dataclass(frozen=True)
class Tracker:
    """One run's MLflow tracking: where the store is, its experiment, the run's name and folder,
    the configuration it logs as parameters, and what each round logs."""

    enabled: bool
    uri: str
    experiment: str
    runs_dir: Path
    run_name: str
    layout: RunLayout
    params: dict[str, Any]
    log_checkpoints: bool = True
    trees_to_render: int = 0

    @classmethod
    def of(cls, cfg: RunConfig) -> Tracker:
        t = cfg.tracking
        uri = t.uri or f"sqlite:///{(Path(cfg.runs_dir) / 'mlflow.db').resolve()}"
        params = flatten({k: v for k, v in to_dict(cfg).items() if isinstance(v, dict)})
        return cls(t.enabled, uri, t.experiment, Path(cfg.runs_dir), cfg.run_name, cfg.layout, params,
                   t.log_checkpoints, cfg.eval.trees_to_render)  # fmt: skip

    # -- the store ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _store_lock(self) -> Iterator[None]:
        """An exclusive lock next to the runs. Opening a fresh SQLite store creates and migrates it:
        two campaigns started at once on a fresh machine raced there (`duplicate column name: step`),
        and both could create the experiment."""
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        with open(self.runs_dir / ".mlflow.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def client(self):
        os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
        from mlflow.tracking import MlflowClient

        with self._store_lock():  # the client opens (on first use: creates) the store
            db = (self.runs_dir / "mlflow.db").resolve()
            if self.uri == f"sqlite:///{db}" and not db.exists():
                seed_store(db)  # a copy of an empty store: MLflow's migrations run once per version
            return MlflowClient(tracking_uri=self.uri)

    def _experiment_id(self, client) -> str:
        with self._store_lock():
            exp = client.get_experiment_by_name(self.experiment)
            if exp is not None:
                return exp.experiment_id
            artifacts = (self.runs_dir / "mlartifacts").resolve()
            return client.create_experiment(self.experiment, artifact_location=artifacts.as_uri())

    def _load_ids(self) -> dict:
        path = self.layout.tracking
        return json.loads(path.read_text()) if path.is_file() else {}

    def _save_ids(self, ids: dict) -> None:
        write_json(self.layout.tracking, ids)

    # -- runs ------------------------------------------------------------------------------------
    def campaign_run_id(self) -> str | None:
        """The campaign's parent run, created on first use and reused when the campaign resumes."""
        if not self.enabled:
            return None
        client = self.client()
        ids = self._load_ids()
        if "campaign" not in ids:
            run = client.create_run(
                self._experiment_id(client), run_name=self.run_name, tags={"rao.run": self.run_name}
            )
            ids["campaign"] = run.info.run_id
            self._save_ids(ids)
            for key, value in list(self.params.items())[:500]:
                client.log_param(run.info.run_id, key, value)
        return ids["campaign"]

    def round_run_id(self, round_: int) -> str | None:
        """The nested run of one round (parent: the campaign run)."""
        parent = self.campaign_run_id()
        if parent is None:
            return None
        ids = self._load_ids()
        key = f"round-{round_}"
        if key not in ids:
            client = self.client()
            run = client.create_run(
                self._experiment_id(client),
                run_name=f"{self.run_name}-round-{round_}",
                tags={"mlflow.parentRunId": parent, "rao.run": self.run_name, "rao.round": str(round_)},
            )
            ids[key] = run.info.run_id
            self._save_ids(ids)
        return ids[key]

    def log_metrics(self, run_id: str | None, metrics: dict[str, Any], step: int) -> None:
        if run_id is None:
            return
        client = self.client()
        for key, value in flatten(metrics).items():
            client.log_metric(run_id, key, value, step=step)

    def log_artifacts(self, run_id: str | None, path: str | Path, artifact_path: str | None = None) -> None:
        if run_id is None:
            return
        path = Path(path)
        client = self.client()
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path)
        elif path.is_file():
            client.log_artifact(run_id, str(path), artifact_path)

    def finish_run(self, run_id: str | None, status: str = "FINISHED") -> None:
        if run_id is not None:
            self.client().set_terminated(run_id, status=status)

    def set_tag(self, run_id: str | None, key: str, value: str) -> None:
        if run_id is not None:
            self.client().set_tag(run_id, key, value[:5000])

    # -- what a campaign logs --------------------------------------------------------------------
    def log_round(self, round_: int, metrics: dict[str, Any]) -> bool:
        """Log one round to MLflow once: its figures (stages/report.py round_report) on its nested run
        and on the campaign run, the evaluation and scores markers, viewer pages of a few trees, the
        checkpoint."""
        run = self.layout
        if run.logged(round_).is_file():
            return False
        run_id = self.round_run_id(round_)
        self.log_metrics(run_id, metrics, step=round_)
        # The campaign run plots evaluation against policy version (0 = the warm start, see log_baseline).
        parent = self.campaign_run_id()
        self.log_metrics(parent, {"eval": metrics["eval"]}, step=round_ + 1)
        self.log_metrics(parent, {k: v for k, v in metrics.items() if k != "eval"}, step=round_)
        for stage, part in (("rollout", run.rollouts(round_)), ("eval", run.eval(round_ + 1))):
            if is_complete(part) and (nodes := read_meta(part).get("nodes")):  # where each shard ran
                self.set_tag(run_id, f"{stage}.nodes", ",".join(nodes))
        for folder, part in (("eval", run.eval(round_ + 1)), ("scores", run.scores(round_))):
            for name in ("summary.json", "_COMPLETE"):
                if (part / name).is_file():
                    self.log_artifacts(run_id, part / name, folder)
        if self.trees_to_render > 0:  # a sample of the round's trees as viewer pages (rao show)
            from rao_core.eval.viewer import write_tree_sample

            write_tree_sample(run.root, round_, self.trees_to_render, run.viewer(round_))
            self.log_artifacts(run_id, run.viewer(round_), "trees")
        if self.log_checkpoints and run.checkpoint_complete(round_ + 1):
            self.log_artifacts(run_id, run.checkpoint(round_ + 1), "checkpoint")
        self.finish_run(run_id)
        write_json(run.logged(round_), metrics)
        return True

    def log_baseline(self, eval_metrics: dict[str, Any]) -> bool:
        """Evaluation of policy version 0 on the campaign run, at step 0 (once)."""
        marker = self.layout.logged_baseline
        if marker.is_file():
            return False
        self.log_metrics(self.campaign_run_id(), {"eval": eval_metrics}, step=0)
        write_json(marker, eval_metrics)
        return True


@contextlib.contextmanager
def campaign_status(trackers: list[Tracker]) -> Iterator[None]:
    """Keep the campaign runs' MLflow status true to what the campaign does: RUNNING while it works
    (a finished run is reopened when rounds are added), then FINISHED, FAILED on an exception, or
    KILLED on an interrupt (Ctrl-C, or SIGTERM, which `rao train` turns into one)."""
    ids = [(t, t.campaign_run_id()) for t in trackers]
    for t, run_id in ids:
        if run_id is not None:
            t.client().update_run(run_id, status="RUNNING")
    status = "FAILED"
    try:
        yield
        status = "FINISHED"
    except Exception:
        raise
    except BaseException:  # Ctrl-C, or SIGTERM (Prefect raises its TerminationSignal inside a flow)
        status = "KILLED"
        raise
    finally:
        for t, run_id in ids:
            t.finish_run(run_id, status)
