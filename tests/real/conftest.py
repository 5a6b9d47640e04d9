"""The real tier's two expensive things, made once per test session and shared by the test files
(pytest-xdist runs files in 2 processes): SmolLM2 converted from its package, and SmolLM2 after a
few warm-start steps. File locks in the session's shared temporary folder make the first process
build them and the other wait for them, and run one real-tier test at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from filelock import FileLock

from rao_core.envs.suites import open_suite
from rao_core.models.locate import KNOWN, known_file, local_model
from rao_core.run import load_config
from rao_core.train.warmstart import warm_start


@pytest.fixture(scope="session")
def shared(tmp_path_factory) -> Path:
    """A folder every xdist process of this session sees (their temporary folders' parent)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if base.name.startswith("popen-gw") else base) / "real-tier"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(autouse=True)
def one_model_at_a_time(shared):
    """One real-tier test at a time across the xdist processes: a SmolLM2 train stage peaks at up
    to 10 GiB here (docs/real-model.md, "Memory"), and two of them beside a vLLM server would not
    fit a 24 GiB machine."""
    with FileLock(shared / "running.lock"):
        yield


@pytest.fixture(scope="session")
def smollm2(shared) -> Path:
    """smollm2-135m converted into the session's folder (RAO_MODELS_DIR)."""
    if known_file("smollm2-135m") is None:
        pytest.fail(f"the real tier needs SmolLM2: {KNOWN['smollm2-135m'].install}", pytrace=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAO_MODELS_DIR", str(shared / "models"))
        with FileLock(shared / "models.lock"):
            folder = local_model("smollm2-135m")
        yield folder


@pytest.fixture(scope="session")
def agent(smollm2, shared) -> Path:
    """SmolLM2 after a few SFT steps on the expert's trees (the warm start stage, bf16): it writes
    cells and sometimes finishes a task, so a round's groups have spread to learn from."""
    out = shared / "warmstart"
    with FileLock(shared / "warmstart.lock"):
        if not (out / "model" / "config.json").is_file():
            cfg = load_config(
                overrides=[
                    "suite=textcraft-small", f"warmstart.init_model={smollm2}", "warmstart.recursive_episodes=48",
                    "warmstart.flat_episodes=0", "warmstart.recursive_tiers=1,2", "warmstart.max_steps=12",
                    "warmstart.batch_size=4", "warmstart.lr=3e-4", "warmstart.eval_tasks=0", "warmstart.threads=2",
                    "warmstart.context=1024", "warmstart.max_minutes=60",  # the steps bound it (1.9 min in CI; a busy machine took > 10)
                ]
            )  # fmt: skip
            metrics = warm_start(cfg.warmstart, out, open_suite(cfg))
            assert metrics["train"]["steps"] == 12
    assert (out / "model" / "trainer_state" / "master" / "config.json").is_file()  # its fp32 master
    assert json.loads((out / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    return out / "model"
