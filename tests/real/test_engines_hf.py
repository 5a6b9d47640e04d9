"""SmolLM2 through the transformers engine, in engine processes: the runs decode path with full
fine-tuning, the static path with LoRA over its tied embeddings (tests/real/rounds.py)."""

from __future__ import annotations

import pytest

from tests.real import needs_bf16_units
from tests.real.rounds import FULL_LR, LORA_LR, two_rounds

pytestmark = [pytest.mark.real, pytest.mark.slow, needs_bf16_units]
HF = ["policy.kind=hf", "policy.engine_processes=1"]


def test_the_runs_path_serves_a_full_update(agent, tmp_path):
    two_rounds(agent, "hf-runs-full", [*HF, "policy.decode=runs", FULL_LR], tmp_path)


def test_the_static_path_serves_a_lora_update(agent, tmp_path):
    two_rounds(agent, "hf-static-lora", [*HF, "policy.decode=static", "train.lora=true", LORA_LR], tmp_path)
