"""The training stage of one round: scored rollouts in, the next policy's Hugging Face checkpoint out.

`train_round` reads the round's trained nodes from the `samples` view, runs the RAO update with
TRL (trainer.py), and writes model + tokenizer + metrics.json to `out_path` atomically: the
checkpoint is built in a hidden temporary folder beside it and renamed into place, so an engine that
finds `out_path` finds a complete checkpoint. Idempotent: a finished `out_path` is returned as is.

Data-parallel on several processes (DDP, FSDP, ZeRO-3), launched as its own program:

    accelerate launch --config_file configs/accelerate/ddp.yaml -m rao_core.train.stage \
        --run-dir runs/default --round 3 --model runs/default/checkpoints/round-3 \
        --out runs/default/checkpoints/round-4 [--config run.yaml] [--set train.lr=1e-6 ...]

Every rank trains its share; only rank 0 writes the checkpoint, the others wait for it. The campaign
starts this itself (`launch_round`) when `train.accelerate_config` is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rao_core.engines.probe import write_probe
from rao_core.train.samples import read_rows
from rao_core.train.trainer import TrainConfig, resolve_device, train_rows, world

METRICS = "metrics.json"
OPTIMIZER = "optimizer.pt"  # AdamW moments after this round (train.keep_optimizer_state)
log = logging.getLogger(__name__)


def is_complete(path: str | Path) -> bool:
    """A checkpoint is complete once its metrics.json exists: it is written last, before the rename."""
    return (Path(path) / METRICS).is_file()


def saved_dtype(model_path: Path) -> torch.dtype:
    """The dtype the input checkpoint declares; the output is saved in it too (engines load it as is)."""
    dtype = getattr(AutoConfig.from_pretrained(model_path, local_files_only=True), "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def load_policy(model_path: Path, cfg: TrainConfig) -> tuple[Any, Any]:
    """Model and tokenizer from a local checkpoint.

    Full fine-tuning keeps float32 master weights (bf16 runs as autocast on top): an update of
    lr 3e-6 is far below bf16's resolution and would be rounded away in bf16 weights. With LoRA the
    frozen base stays in the checkpoint's dtype and only the adapter trains.
    """
    dtype = saved_dtype(model_path) if cfg.lora else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, local_files_only=True)
    if world()[1] == 1:  # launched: the trainer places each rank's copy (its own GPU, or its shards)
        model.to(resolve_device(cfg))
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    return model, tokenizer


def _publish(tmp: Path, out_path: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """Write metrics.json last, then rename the folder into place; a concurrent winner is kept."""
    (tmp / METRICS).write_text(json.dumps(metrics, indent=2, default=str))
    if out_path.exists() and not is_complete(out_path):  # leftover of a crashed non-atomic writer
        shutil.rmtree(out_path)
    try:
        os.rename(tmp, out_path)
    except OSError:
        if not is_complete(out_path):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return json.loads((out_path / METRICS).read_text())
    return metrics


def train_round(
    run_dir: Path, round: int, model_path: Path, out_path: Path, cfg: TrainConfig
) -> dict[str, Any]:
    """Train policy version round+1 on round `round` of `run_dir`, starting from `model_path`.

    Returns the metrics (also in `out_path/metrics.json`): loss, tokens, samples, grad_norm,
    seconds, tokens_per_s, mean_ratio, clipped_fraction, ... With no trainable row the input
    checkpoint is copied forward unchanged (the policy version still advances) and `skipped` says why.
    """
    run_dir, model_path, out_path = Path(run_dir), Path(model_path), Path(out_path)
    if is_complete(out_path):
        return json.loads((out_path / METRICS).read_text())
    rank, world_size = world()
    if world_size > 1:
        _publish_on_rank0(run_dir, round, model_path, out_path, cfg, rank)
        return json.loads((out_path / METRICS).read_text())
    return _train_and_publish(run_dir, round, model_path, out_path, cfg)


def _publish_on_rank0(
    run_dir: Path, round: int, model_path: Path, out_path: Path, cfg: TrainConfig, rank: int
) -> None:
    """Launched on several processes: every rank trains, rank 0 alone writes, the others wait for it.

    The process group is set up first so that the barrier also works when nothing is trained.
    """
    from accelerate import PartialState

    state = PartialState(cpu=resolve_device(cfg) == "cpu")
    try:
        _train_and_publish(run_dir, round, model_path, out_path, cfg, write=rank == 0)
    finally:
        state.wait_for_everyone()


def _train_and_publish(
    run_dir: Path, round: int, model_path: Path, out_path: Path, cfg: TrainConfig, write: bool = True
) -> dict[str, Any]:
    """Train (every rank) and, when `write`, build the checkpoint in a temporary folder and publish it."""
    t0 = time.perf_counter()
    rows = read_rows(run_dir, round)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.parent / f".tmp-{out_path.name}-{uuid.uuid4().hex[:8]}"
    head = {
        "round": round,
        "policy_version": round + 1,
        "model_path": str(model_path),
        "config": dataclasses.asdict(cfg),
    }
    try:
        if not any(r.action_tokens for r in rows):
            reason = "no trained rows" if not rows else "no trainable action tokens"
            metrics = {**head, "samples": len(rows), "steps": 0, "tokens": 0, "skipped": reason}
            if not write:
                return metrics
            shutil.copytree(model_path, tmp, ignore=shutil.ignore_patterns(METRICS))  # moments too
        else:
            model, tokenizer = load_policy(model_path, cfg)
            resume = model_path / OPTIMIZER
            state = None
            if cfg.keep_optimizer_state and resume.is_file():
                state = torch.load(resume, map_location="cpu", weights_only=True)
            with tempfile.TemporaryDirectory(prefix="rao-train-") as work:
                model, metrics = train_rows(model, tokenizer, rows, cfg, Path(work), optimizer_state=state)
            optimizer_state = metrics.pop("optimizer_state", None)
            metrics = {**head, **metrics, "resumed_optimizer": state is not None}
            if not write:
                return metrics
            assert model is not None  # rank 0 always gets the whole model back
            model.to(saved_dtype(model_path)).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            write_probe(model.eval(), tokenizer, tmp)  # how an engine proves it serves these weights
            if optimizer_state is not None:
                torch.save(optimizer_state, tmp / OPTIMIZER)
            del model  # the flow process lives on: hand the GPU memory back before the next stage
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        metrics["stage_seconds"] = time.perf_counter() - t0
        metrics = _publish(tmp, out_path, metrics)
        if model_path.parent == out_path.parent:  # the run's own checkpoints: keep the latest moments
            (model_path / OPTIMIZER).unlink(missing_ok=True)  # only (a 4B model's are 32 GB a round)
        log.info("rank %d wrote checkpoint %s", world()[0], out_path)
        return metrics
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def launcher(accelerate_config: str | Path) -> tuple[list[str], dict[str, str]]:
    """The command (and extra environment) that starts the N processes an accelerate config describes.

    `accelerate launch` starts several CPU processes only through mpirun (MULTI_CPU): a CPU config
    (`use_cpu: true`) is started with torchrun instead (gloo backend, a free port of its own), which
    is the same data-parallel run. Every other config goes to `accelerate launch --config_file`.
    """
    conf = yaml.safe_load(Path(accelerate_config).read_text()) or {}
    n = int(conf.get("num_processes", 1))
    if conf.get("use_cpu") and n > 1 and not conf.get("mpirun_config"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
        return cmd, {"ACCELERATE_USE_CPU": "true"}
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config)], {}


def launch_round(
    accelerate_config: str | Path,
    run_dir: Path,
    round: int,
    model_path: Path,
    out_path: Path,
    cfg: TrainConfig,
) -> dict[str, Any]:
    """`train_round` on N processes, as `accelerate launch --config_file <accelerate_config> -m rao_core.train.stage`.

    `accelerate launch` starts N copies of a program, so the campaign cannot be launched that way (it
    would run N campaigns): it starts this stage alone as a subprocess and waits for its checkpoint.
    The training config travels as a YAML file; the child never relaunches itself.
    """
    if is_complete(out_path):
        return json.loads((Path(out_path) / METRICS).read_text())
    cmd, env = launcher(accelerate_config)
    with tempfile.TemporaryDirectory(prefix="rao-launch-") as tmp:
        conf = Path(tmp) / "run.yaml"
        conf.write_text(yaml.safe_dump({"train": {**dataclasses.asdict(cfg), "accelerate_config": ""}}))
        cmd += ["-m", "rao_core.train.stage", "--run-dir", str(run_dir), "--round", str(round)]
        cmd += ["--model", str(model_path), "--out", str(out_path), "--config", str(conf)]
        subprocess.run(cmd, check=True, env={**os.environ, **env})
    if not is_complete(out_path):
        raise RuntimeError(
            f"the launched training stage finished without a complete checkpoint at {out_path}"
        )
    return json.loads((Path(out_path) / METRICS).read_text())


def main(argv: list[str] | None = None) -> None:
    """Entry point of one launched training stage; rank 0 prints the round's metrics as JSON."""
    from rao_core.config import load_config

    p = argparse.ArgumentParser(prog="python -m rao_core.train.stage", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", required=True, type=Path, help="the run folder (rollouts and scores)")
    p.add_argument("--round", required=True, type=int, help="the scored round to train on")
    p.add_argument("--model", required=True, type=Path, help="checkpoint of policy version `round`")
    p.add_argument("--out", required=True, type=Path, help="where policy version round+1 is written")
    p.add_argument("--config", type=Path, help="run YAML; only its `train` section is used")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.lr=1e-6"
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    cfg = load_config(a.config, a.set).train
    metrics = train_round(a.run_dir, a.round, a.model, a.out, cfg)
    if world()[0] == 0:
        print(json.dumps({k: v for k, v in metrics.items() if k != "config"}, default=str))


if __name__ == "__main__":
    main()
