"""Hub ids: `policy.model=Org/Name` resolves through the local Hugging Face cache for the config
checks, the engines and the trainer; offline, one that is not cached is refused in one line
(test_hub_download.py: downloads on first use, from a fake hub)."""

from __future__ import annotations

import huggingface_hub.constants
import pytest

from rao_core.checkpoints import initial_model
from rao_core.config import ConfigError
from rao_core.envs.suites import open_suite
from rao_core.run import Run, load_config
from rao_core.stages import common
from rao_core.stages.rollout import roll_out
from rao_core.stages.score import score
from rao_core.stages.train import train
from tests.agent.families import FAMILIES, checkpoint

REPO, COMMIT = "Org/Tiny-Qwen3", "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A Hugging Face cache holding one model, laid out as `hf download` leaves it."""
    cache = tmp_path / "hub"
    repo = cache / f"models--{REPO.replace('/', '--')}"
    snapshot = checkpoint(FAMILIES["qwen3"], repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return snapshot


def config(tmp_path, *overrides: str):
    return load_config(
        overrides=[
            f"runs_dir={tmp_path / 'runs'}", "run_name=hub", f"policy.model={REPO}",
            "agent.max_steps=2", "agent.max_new_tokens=8", "rollout.difficulty=medium", "rollout.num_tasks=1",
            "rollout.group_size=2", "scoring.zero_advantage_groups=keep", "tracking.enabled=false", *overrides,
        ]
    )  # fmt: skip


def test_a_cached_hub_id_trains_and_serves(tmp_path, hub):
    cfg = config(tmp_path, "policy.engine_processes=0")  # the engine here (its children load the same folder)
    assert initial_model(cfg.policy.model, cfg.run_dir) == hub
    open_suite(cfg)
    roll_out(Run(cfg), 0)
    score(Run(cfg), 0)
    metrics = train(Run(cfg), 0)
    assert metrics["model_path"] == str(hub) and metrics["served_dtype"] == "bfloat16"
    assert (cfg.layout.checkpoint(1) / "trainer_state" / "master" / "config.json").is_file()


def test_vllm_is_given_the_snapshot_folder(tmp_path, hub, monkeypatch):
    """The vLLM server is started on the resolved local folder (it never sees the hub id)."""
    import rao_core.engines as engines

    seen = []
    monkeypatch.setattr(engines, "build_engine", lambda policy_cfg, *a, **k: seen.append(policy_cfg.model))
    cfg = config(tmp_path, "policy.kind=vllm", "policy.vllm_python=/bin/sh")
    common.open_policy(Run(cfg), None, 0, cfg.agent.max_context_tokens)
    assert seen == [str(hub)]


def test_offline_a_hub_id_that_is_not_cached_is_one_clear_line(tmp_path, hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never asks the real hub, whatever the shell says
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"runs_dir={tmp_path}", "policy.model=Org/Missing@v2"])
    assert str(err.value) == (
        f"policy.model: 'Org/Missing@v2' is not in the Hugging Face cache ({tmp_path / 'hub'}) and "
        "HF_HUB_OFFLINE=1 forbids downloading it: fetch it first (`hf download Org/Missing --revision v2`) "
        "or unset HF_HUB_OFFLINE"
    )
