"""The training stage across nodes: `train.launcher=torchrun` with 2 nodes of 1 process each, two
torchrun agents on loopback (tests/train/loopback_nodes.py stands in for srun) that meet through a
c10d rendezvous and train over gloo. DDP and FSDP2 (`fully_shard` on CPU ranks, cpu_fsdp.py) give the
loss and weights of one process; rank 0 alone writes one consolidated checkpoint; a rank killed
mid-stage ends the launch in one line, never a hang, and the next attempt trains the round."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from rao_core.checkpoints import is_complete
from rao_core.config import ConfigError
from rao_core.run import Run, load_config
from rao_core.stages.train import train
from rao_core.train.launch import LaunchError
from rao_core.train.stage import train_round
from tests.train import one_thread  # noqa: F401 (autouse fixture)
from tests.train.test_distributed import TRAIN
from tests.train.test_stage import checkpoint, write_round  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow  # 2 agents and 2 ranks, each importing torch and TRL: ~30 s a launch

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = f"{sys.executable} {ROOT / 'tests' / 'train' / 'loopback_nodes.py'} 2"
TOLERANCE = {"ddp-cpu": (1e-6, 1e-6), "fsdp-cpu": (1e-5, 1e-5)}  # loss (relative), weights (absolute)
PARALLELISM = {"ddp-cpu": "MULTI_CPU", "fsdp-cpu": "FSDP"}  # accelerate's name for what ran


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(tmp_path: Path, checkpoint: Path, parallelism: str):  # noqa: F811
    return load_config(overrides=[
        f"runs_dir={tmp_path}", "run_name=run", f"policy.model={checkpoint}", *TRAIN,
        f"train.accelerate_config={ROOT / 'configs' / 'accelerate' / f'{parallelism}.yaml'}",
        "train.launcher=torchrun", "train.nnodes=2", f"train.rdzv_endpoint=127.0.0.1:{free_port()}",
        f"train.node_command={LOOPBACK}",
    ])  # fmt: skip


@pytest.mark.parametrize("parallelism", sorted(TOLERANCE))
def test_two_nodes_give_the_loss_and_weights_of_one_process(tmp_path, checkpoint, capfd, parallelism):  # noqa: F811
    cfg = two_nodes(tmp_path, checkpoint, parallelism)
    write_round(cfg.run_dir, [1.0, 0.0, 1.0, 0.0])
    one = train_round(cfg.run_dir, 0, checkpoint, tmp_path / "one", cfg.train)  # in this process
    capfd.readouterr()
    two = train(Run(cfg), 0)  # the campaign's path: 2 agents, a rank each, through the rendezvous
    err = capfd.readouterr().err

    loss_rel, weight_abs = TOLERANCE[parallelism]
    assert (one["processes"], two["processes"]) == (1, 2)
    assert (one["parallelism"], two["parallelism"]) == ("NO", PARALLELISM[parallelism])
    assert (two["sharded_params"] > 0) == (parallelism == "fsdp-cpu") and not one["sharded_params"]
    assert two["loss"] == pytest.approx(one["loss"], rel=loss_rel)
    assert two["step_losses"] == pytest.approx(one["step_losses"], rel=loss_rel)
    out = cfg.layout.checkpoint(1)
    w1, w2 = load_file(tmp_path / "one" / "model.safetensors"), load_file(out / "model.safetensors")
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=weight_abs, msg=lambda m, k=k: f"{k}: {m}")
    moved = max(
        (w1[k] - w0).abs().max().item() for k, w0 in load_file(checkpoint / "model.safetensors").items()
    )
    worst = max((w2[k] - w1[k]).abs().max().item() for k in w1)
    print(
        f"{parallelism}: loss {two['loss']:.6f} vs {one['loss']:.6f}, weights within {worst:.1e} (moved {moved:.1e})"
    )
    assert err.count("wrote checkpoint") == 1  # one consolidated checkpoint, by rank 0
    assert is_complete(out) and sorted(p.name for p in out.parent.iterdir()) == ["version=1"]
    assert not list(cfg.run_dir.glob(".launch-*"))  # the config the nodes read is removed


@pytest.mark.parametrize(
    ("conf", "error"),
    [
        ("distributed_type: DEEPSPEED\nuse_cpu: true\nnum_processes: 2\n", "DeepSpeed only on GPUs"),
        ("distributed_type: FSDP\nuse_cpu: true\nnum_processes: 2\n", "needs fsdp_config.fsdp_version: 2"),
    ],
)
def test_a_cpu_config_that_cannot_shard_is_refused(tmp_path, conf, error):
    path = tmp_path / "cpu.yaml"
    path.write_text(conf)
    with pytest.raises(ConfigError, match=error):
        load_config(overrides=[f"runs_dir={tmp_path}", f"train.accelerate_config={path}"])


def ranks_of(pid: int) -> list[psutil.Process]:
    """The stage's ranks under this process (not their torchrun agents)."""
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if (
            "rao_core.train.stage" in argv
            and "torch.distributed.run" not in argv
            and "watchdog.py" not in " ".join(argv)
        ):
            found.append(p)
    return found


def test_a_rank_killed_mid_stage_ends_the_launch_in_one_line(tmp_path, checkpoint):  # noqa: F811
    cfg = two_nodes(tmp_path, checkpoint, "ddp-cpu")
    write_round(cfg.run_dir, [1.0, 0.0, 1.0, 0.0])
    killed = []

    def kill_one_rank() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(ranks := ranks_of(psutil.Process().pid)) < 2:
            time.sleep(0.1)
        time.sleep(3)  # both ranks importing, loading or training
        if ranks:
            ranks[-1].kill()
            killed.append(ranks[-1].pid)

    killer = threading.Thread(target=kill_one_rank, daemon=True)
    killer.start()
    start = time.monotonic()
    with pytest.raises(LaunchError) as e:
        train(Run(cfg), 0)
    seconds = time.monotonic() - start
    killer.join()
    assert killed  # and the launch ended (a hang would meet the test's timeout)
    assert "\n" not in str(e.value) and "the same command trains this round again" in str(e.value)
    assert not ranks_of(psutil.Process().pid) and not is_complete(cfg.layout.checkpoint(1))
    print(f"a killed rank ended the launch {seconds:.1f} s after it started")

    cfg = two_nodes(tmp_path, checkpoint, "ddp-cpu")  # a new rendezvous port, as a new command has
    assert train(Run(cfg), 0)["processes"] == 2 and is_complete(cfg.layout.checkpoint(1))
