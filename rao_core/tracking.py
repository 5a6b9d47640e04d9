"""MLflow tracking: one parent run per training campaign, one nested run per round, and what each
round logs there (once: a marker under <run>/logged/ makes a resumed campaign skip it).

Uses MlflowClient with explicit run ids (no fluent "active run" state), so stages may log from any
thread or process, and a resumed campaign continues the same runs: their ids are kept in
`runs/<run>/tracking.json`. The default backend is SQLite with a local artifact folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rao_core.config import RunConfig, to_dict
from rao_core.store.files import write_json


def tracking_uri(cfg: RunConfig) -> str:
    if cfg.tracking.uri:
        return cfg.tracking.uri
    return f"sqlite:///{(Path(cfg.runs_dir) / 'mlflow.db').resolve()}"


@contextlib.contextmanager
def _store_lock(cfg: RunConfig) -> Iterator[None]:
    """An exclusive lock next to the runs. Opening a fresh SQLite store creates and migrates it:
    two campaigns started at once on a fresh machine raced there (`duplicate column name: step`),
    and both could create the experiment."""
    Path(cfg.runs_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(cfg.runs_dir) / ".mlflow.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _client(cfg: RunConfig):
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    from mlflow.tracking import MlflowClient

    with _store_lock(cfg):  # the client opens (on first use: creates) the store
        return MlflowClient(tracking_uri=tracking_uri(cfg))


def _experiment_id(client, cfg: RunConfig) -> str:
    with _store_lock(cfg):
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        if exp is not None:
            return exp.experiment_id
        artifacts = (Path(cfg.runs_dir) / "mlartifacts").resolve()
        return client.create_experiment(cfg.tracking.experiment, artifact_location=artifacts.as_uri())


def _ids_path(cfg: RunConfig) -> Path:
    return cfg.layout.tracking


def _load_ids(cfg: RunConfig) -> dict:
    path = _ids_path(cfg)
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_ids(cfg: RunConfig, ids: dict) -> None:
    write_json(_ids_path(cfg), ids)


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


def campaign_run_id(cfg: RunConfig) -> str | None:
    """The campaign's parent run, created on first use and reused when the campaign resumes."""
    if not cfg.tracking.enabled:
        return None
    client = _client(cfg)
    ids = _load_ids(cfg)
    if "campaign" not in ids:
        run = client.create_run(
            _experiment_id(client, cfg), run_name=cfg.run_name, tags={"rao.run": cfg.run_name}
        )
        ids["campaign"] = run.info.run_id
        _save_ids(cfg, ids)
        params = flatten({k: v for k, v in to_dict(cfg).items() if isinstance(v, dict)})
        for key, value in list(params.items())[:500]:
            client.log_param(run.info.run_id, key, value)
    return ids["campaign"]


def round_run_id(cfg: RunConfig, round_: int) -> str | None:
    """The nested run of one round (parent: the campaign run)."""
    parent = campaign_run_id(cfg)
    if parent is None:
        return None
    ids = _load_ids(cfg)
    key = f"round-{round_}"
    if key not in ids:
        client = _client(cfg)
        run = client.create_run(
            _experiment_id(client, cfg),
            run_name=f"{cfg.run_name}-round-{round_}",
            tags={"mlflow.parentRunId": parent, "rao.run": cfg.run_name, "rao.round": str(round_)},
        )
        ids[key] = run.info.run_id
        _save_ids(cfg, ids)
    return ids[key]


def log_metrics(cfg: RunConfig, run_id: str | None, metrics: dict[str, Any], step: int) -> None:
    if run_id is None:
        return
    client = _client(cfg)
    for key, value in flatten(metrics).items():
        client.log_metric(run_id, key, value, step=step)


def log_artifacts(
    cfg: RunConfig, run_id: str | None, path: str | Path, artifact_path: str | None = None
) -> None:
    if run_id is None:
        return
    path = Path(path)
    client = _client(cfg)
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path)
    elif path.is_file():
        client.log_artifact(run_id, str(path), artifact_path)


def finish_run(cfg: RunConfig, run_id: str | None, status: str = "FINISHED") -> None:
    if run_id is not None:
        _client(cfg).set_terminated(run_id, status=status)


def set_tag(cfg: RunConfig, run_id: str | None, key: str, value: str) -> None:
    if run_id is not None:
        _client(cfg).set_tag(run_id, key, value[:5000])


@contextlib.contextmanager
def campaign_status(cfgs: list[RunConfig]) -> Iterator[None]:
    """Keep the campaign runs' MLflow status true to what the campaign does: RUNNING while it works
    (a finished run is reopened when rounds are added), then FINISHED, FAILED on an exception, or
    KILLED on an interrupt (Ctrl-C, or SIGTERM, which `rao train` turns into one)."""
    ids = [(cfg, campaign_run_id(cfg)) for cfg in cfgs]
    for cfg, run_id in ids:
        if run_id is not None:
            _client(cfg).update_run(run_id, status="RUNNING")
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
        for cfg, run_id in ids:
            finish_run(cfg, run_id, status)


def log_round(cfg: RunConfig, round_: int, metrics: dict[str, Any]) -> bool:
    """Log one round to MLflow once: its figures (reporting.round_report) on its nested run and on
    the campaign run, the evaluation and scores markers, viewer pages of a few trees, the checkpoint."""
    run = cfg.layout
    if run.logged(round_).is_file():
        return False
    run_id = round_run_id(cfg, round_)
    log_metrics(cfg, run_id, metrics, step=round_)
    # The campaign run plots evaluation against policy version (0 = the warm start, see log_baseline).
    parent = campaign_run_id(cfg)
    log_metrics(cfg, parent, {"eval": metrics["eval"]}, step=round_ + 1)
    log_metrics(cfg, parent, {k: v for k, v in metrics.items() if k != "eval"}, step=round_)
    for folder, part in (("eval", run.eval(round_ + 1)), ("scores", run.scores(round_))):
        for name in ("summary.json", "_COMPLETE"):
            if (part / name).is_file():
                log_artifacts(cfg, run_id, part / name, folder)
    if cfg.eval.trees_to_render > 0:  # a sample of the round's trees as viewer pages (rao show)
        from rao_core.eval.viewer import write_tree_sample

        write_tree_sample(cfg.run_dir, round_, cfg.eval.trees_to_render, run.viewer(round_))
        log_artifacts(cfg, run_id, run.viewer(round_), "trees")
    if cfg.tracking.log_checkpoints and run.checkpoint_complete(round_ + 1):
        log_artifacts(cfg, run_id, run.checkpoint(round_ + 1), "checkpoint")
    finish_run(cfg, run_id)
    write_json(run.logged(round_), metrics)
    return True


def log_baseline(cfg: RunConfig, eval_metrics: dict[str, Any]) -> bool:
    """Evaluation of policy version 0 on the campaign run, at step 0 (once)."""
    marker = cfg.layout.logged_baseline
    if marker.is_file():
        return False
    log_metrics(cfg, campaign_run_id(cfg), {"eval": eval_metrics}, step=0)
    write_json(marker, eval_metrics)
    return True
