"""Launching the training stage on several processes, on one node or several.

`accelerate launch` starts N copies of a program, so the campaign cannot be launched that way (it
would run N campaigns): it starts the stage alone (`python -m rao_core.train.stage`) under a
launcher and waits for its checkpoint. Two launchers (`train.launcher`):

- `accelerate` (default): `accelerate launch --config_file <train.accelerate_config>`. A CPU
  config (`use_cpu: true`) is started with torchrun instead, since `accelerate launch` starts
  several CPU processes only through mpirun.
- `torchrun`: `torchrun --nnodes <train.nnodes>` with a c10d rendezvous at `train.rdzv_endpoint`,
  `num_processes / nnodes` ranks per node, and the environment `accelerate launch` would give them
  from the same config (DDP, FSDP2, precision), computed by accelerate itself. With nnodes > 1,
  `train.node_command` starts the command once on every node (`srun --nodes=2
  --ntasks-per-node=1`, say); the ranks find each other through the rendezvous.

The training config travels as a YAML file in the run folder, which every node sees; the stage
never relaunches itself. A failed rank ends the launch in one line (LaunchError), and since the
checkpoint is published only once complete, the next `rao train` trains that round again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from rao_core import interrupts, runlock
from rao_core.checkpoints import is_complete
from rao_core.config import TrainConfig
from rao_core.layout import METRICS

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


class LaunchError(RuntimeError):
    """The launched training stage failed (a rank exited with an error, or was killed)."""


def accelerate_env(accelerate_config: str | Path) -> dict[str, str]:
    """What `accelerate launch --config_file F` puts in its ranks' environment (the parallelism:
    DDP or FSDP and its settings, mixed precision), from accelerate's own parsing of F."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(accelerate_config), "-m", "x"])
    args, _, _ = _validate_launch_command(args)
    env = {k: v for k, v in prepare_multi_gpu_env(args).items() if os.environ.get(k) != v}
    env.pop("OMP_NUM_THREADS", None)  # accelerate's 1 thread per rank; the stage sets its own
    return {**env, **({"ACCELERATE_USE_CPU": "true"} if args.use_cpu else {})}


def launch_command(cfg: TrainConfig, rdzv_id: str) -> tuple[list[str], dict[str, str]]:
    """The command (and extra environment) that starts the stage's ranks as `cfg` describes."""
    conf = yaml.safe_load(Path(cfg.accelerate_config).read_text()) or {}
    n = int(conf.get("num_processes", 1))
    if cfg.launcher == "torchrun":
        cmd = [*TORCHRUN, f"--nnodes={cfg.nnodes}", f"--nproc-per-node={n // cfg.nnodes}", "--max-restarts=0"]
        if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
            cmd.append("--standalone")
        else:
            cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={cfg.rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
        return [*shlex.split(cfg.node_command), *cmd], accelerate_env(cfg.accelerate_config)
    if conf.get("use_cpu") and n > 1 and not conf.get("mpirun_config"):
        return [*TORCHRUN, "--standalone", f"--nproc_per_node={n}"], {"ACCELERATE_USE_CPU": "true"}
    accelerate_launch = [sys.executable, "-m", "accelerate.commands.launch"]
    return [*accelerate_launch, "--config_file", str(cfg.accelerate_config)], {}


def launch_round(
    run_dir: Path,
    round: int,
    model_path: Path,
    out_path: Path,
    cfg: TrainConfig,
    origin: Path | None = None,
    tokenizer: str | Path | None = None,
) -> dict[str, Any]:
    """`train_round` on the processes `cfg.accelerate_config` describes, launched as `cfg.launcher`
    says; returns the metrics rank 0 wrote with the checkpoint."""
    if is_complete(out_path):
        return json.loads((Path(out_path) / METRICS).read_text())
    cmd, env = launch_command(cfg, f"rao-{uuid.uuid4().hex[:12]}")
    conf = Path(run_dir) / f".launch-round={round}-{uuid.uuid4().hex[:8]}.yaml"  # seen by every node
    alone = {
        "accelerate_config": "",
        "launcher": "accelerate",
        "nnodes": 1,
        "rdzv_endpoint": "",
        "node_command": "",
    }
    conf.write_text(yaml.safe_dump({"train": {**dataclasses.asdict(cfg), **alone}}))
    cmd += ["-m", "rao_core.train.stage", "--run-dir", str(run_dir), "--round", str(round)]
    cmd += ["--model", str(model_path), "--out", str(out_path), "--config", str(conf)]
    cmd += ["--origin", str(origin)] if origin else []
    cmd += ["--tokenizer", str(tokenizer)] if tokenizer else []
    try:  # an interrupt ends the ranks too; `rao status` says the stage runs launched
        interrupts.run_in_own_session(
            cmd, {**os.environ, **env}, lambda: runlock.note_progress(run_dir, "launched")
        )
    except subprocess.CalledProcessError as e:
        raise LaunchError(
            f"the training stage of round {round} failed: its launcher exited with code {e.returncode} "
            "(the ranks' errors are above); nothing was published, so the same command trains this "
            "round again"
        ) from None
    finally:
        conf.unlink(missing_ok=True)
    if not is_complete(out_path):
        raise LaunchError(f"the launched training stage finished without a complete checkpoint at {out_path}")
    return json.loads((Path(out_path) / METRICS).read_text())
