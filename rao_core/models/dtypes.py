"""Which precision a model runs in when a setting says "auto": one rule for the engines, the trainer
and the warm start. Torch-free (the memory plan and config checks use it).

    GPU:                         bfloat16
    CPU with bf16 matrix units:  the checkpoint's own dtype (bf16 for a model published in bf16,
                                 SmolLM2 converted here included; float32 for the tiny models)
    CPU without them:            float32 (bf16 is emulated there, and slower than float32)

Why the checkpoint's dtype on such a CPU: on AMX a bf16 matmul is 3-8x a float32 one, and SmolLM2's
training step and decode run 1.5-2x faster in bf16 (docs/training.md, docs/engines.md), but the tiny
models (0.85M parameters, hidden 128) gain nothing: their steps are Python and memory traffic, not
matmuls, and their shipped results were measured in float32. A checkpoint's dtype says which kind of
model it is without a size threshold. The trainer always keeps float32 master weights (bf16 is
autocast), so "bf16" there changes the arithmetic, never what is stored.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of hardware bf16 matrix math


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX or AVX512-BF16)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no way to tell cheaply; float32 is the safe side
        return False
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return any(f in flags for f in BF16_FLAGS)


def declared_dtype(folder: str | Path) -> str:
    """The dtype a checkpoint's config.json declares ("float32" when it declares none); an
    adapter folder's is its base's."""
    adapter = Path(folder) / "adapter_config.json"
    if adapter.is_file():  # peft's folder: its base names the weights the adapter rides on
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        return declared_dtype(base) if base and Path(base).is_dir() else "float32"
    config = Path(folder) / "config.json"
    if not config.is_file():
        return "float32"
    c = json.loads(config.read_text())
    c = c.get("text_config", c)
    dtype = c.get("dtype") or c.get("torch_dtype") or "float32"
    return str(dtype).removeprefix("torch.")


def auto_dtype(device_type: str, folder: str | Path | None) -> str:
    """The "auto" precision of a model in `folder` on a device of `device_type` (cpu, cuda)."""
    if device_type == "cuda":
        return "bfloat16"
    if folder is not None and cpu_has_bf16() and declared_dtype(folder) == "bfloat16":
        return "bfloat16"
    return "float32"
