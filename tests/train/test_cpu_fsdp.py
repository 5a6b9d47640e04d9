"""When the stage lets accelerate shard on CPU ranks (rao_core/train/cpu_fsdp.py): only for a CPU
launch that asks for FSDP2. The sharded run itself is in test_multinode.py (fsdp-cpu.yaml)."""

from __future__ import annotations

import pytest
from accelerate.state import AcceleratorState

from rao_core.train import cpu_fsdp


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setattr(AcceleratorState, "__init__", AcceleratorState.__init__)  # undone after the test
    for name in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_CPU", "FSDP_VERSION"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "flags", [{}, {"ACCELERATE_USE_FSDP": "true"}, {"ACCELERATE_USE_CPU": "true", "FSDP_VERSION": "2"}]
)
def test_nothing_is_patched_unless_a_cpu_launch_asks_for_fsdp(env, flags):
    for name, value in flags.items():
        env.setenv(name, value)
    before = AcceleratorState.__init__
    assert cpu_fsdp.allow_fsdp_on_cpu() is False and AcceleratorState.__init__ is before


def test_a_cpu_fsdp_launch_is_patched_and_fsdp1_is_refused(env):
    env.setenv("ACCELERATE_USE_FSDP", "true")
    env.setenv("ACCELERATE_USE_CPU", "true")
    env.setenv("FSDP_VERSION", "1")
    with pytest.raises(ValueError, match="fsdp_version: 2"):
        cpu_fsdp.allow_fsdp_on_cpu()
    env.setenv("FSDP_VERSION", "2")
    assert cpu_fsdp.allow_fsdp_on_cpu() is True
    assert AcceleratorState.__init__ is cpu_fsdp._init_choosing_fsdp
    assert cpu_fsdp.allow_fsdp_on_cpu() is True and AcceleratorState.__init__ is cpu_fsdp._init_choosing_fsdp
