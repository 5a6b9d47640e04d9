"""FSDP2 on CPU ranks, so the sharded training path runs (and is tested) without a GPU.

accelerate 1.15 turns `ACCELERATE_USE_FSDP` into FSDP only on GPU-like devices; on CPU ranks it
falls back to DDP without a word. torch's `fully_shard` itself runs on the CPU over gloo, so when a
CPU launch asks for FSDP (configs/accelerate/fsdp-cpu.yaml) this module makes accelerate take the
very path it takes on GPUs: `AcceleratorState` records FSDP and its plugin, and from there
accelerate's own `fsdp2_prepare_model`, gradient clipping and state-dict gathering run unchanged.
On a GPU, or without FSDP in the environment, nothing is patched.
"""

from __future__ import annotations

import os
from typing import Any

from accelerate.state import AcceleratorState, DistributedType

_original_init = AcceleratorState.__init__


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() == "true"


def _init_choosing_fsdp(self: AcceleratorState, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
    _original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    # every AcceleratorState() copies the process state's MULTI_CPU back in: choose FSDP again each time
    plugin = fsdp_plugin or getattr(self, "fsdp_plugin", None)
    if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP  # what accelerate sets for GPU ranks
        self.fsdp_plugin = plugin


def allow_fsdp_on_cpu() -> bool:
    """Let accelerate shard with FSDP2 on CPU ranks when the launch asks for FSDP on the CPU
    (`ACCELERATE_USE_FSDP` and `ACCELERATE_USE_CPU`, as launch.accelerate_env sets them); returns
    whether it did. Idempotent."""
    if not (_flag("ACCELERATE_USE_FSDP") and _flag("ACCELERATE_USE_CPU")):
        return False
    if os.environ.get("FSDP_VERSION", "1") != "2":
        raise ValueError("FSDP on CPU ranks needs fsdp_version: 2 (fully_shard) in train.accelerate_config")
    AcceleratorState.__init__ = _init_choosing_fsdp
    return True
