"""'auto' precision (rao_core/models/dtypes.py) and the probe tolerance that follows from it."""

from __future__ import annotations

import json

from rao_core.config import VLLMPolicy
from rao_core.engines.vllm_args import weight_check_tolerance
from rao_core.models import dtypes


def checkpoint(folder, dtype: str):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": dtype}))
    return folder


def test_an_adapter_declares_its_base_dtype(tmp_path):
    base = checkpoint(tmp_path / "base", "bfloat16")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    assert dtypes.declared_dtype(adapter) == "bfloat16"
    assert dtypes.declared_dtype(checkpoint(tmp_path / "fp32", "float32")) == "float32"
    assert dtypes.declared_dtype(tmp_path) == "float32"  # no config: float32


def test_auto_precision_follows_the_checkpoint_on_a_bf16_cpu_only(tmp_path, monkeypatch):
    bf16, fp32 = checkpoint(tmp_path / "a", "bfloat16"), checkpoint(tmp_path / "b", "float32")
    monkeypatch.setattr(dtypes, "cpu_has_bf16", lambda: True)
    assert [dtypes.auto_dtype("cpu", f) for f in (bf16, fp32)] == ["bfloat16", "float32"]
    assert dtypes.auto_dtype("cuda", fp32) == "bfloat16"
    cfg = VLLMPolicy(device="cpu")
    assert weight_check_tolerance(cfg, bf16) == ("median", 0.05)
    assert weight_check_tolerance(cfg, fp32) == ("max", 1e-3)
    assert weight_check_tolerance(VLLMPolicy(device="cpu", weight_check_tolerance=0.2), bf16) == (
        "median",
        0.2,
    )
    monkeypatch.setattr(dtypes, "cpu_has_bf16", lambda: False)
    assert dtypes.auto_dtype("cpu", bf16) == "float32"
