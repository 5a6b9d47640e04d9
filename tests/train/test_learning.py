"""One optimiser step moves log-probabilities the way the advantages say."""

from __future__ import annotations

import copy

import numpy as np
import torch

from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.train.samples import Row, make_row
from rao_core.train.trainer import TrainConfig, train_rows
from tests.train import one_thread, reference_token_logps, tiny_model  # noqa: F401 (autouse fixture)


def action_logp(model: torch.nn.Module, rows: list[Row]) -> np.ndarray:
    """Mean log-prob of each row's action tokens."""
    with torch.no_grad():
        return np.array(
            [float(reference_token_logps(model, r)[torch.as_tensor(r.action_mask[1:])].mean()) for r in rows]
        )


def make_rows(seed: int) -> list[Row]:
    """Half the rows rewarded, half punished; their actions use disjoint token ranges."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(8):
        positive = i % 2 == 0
        lo, hi = (3, 250) if positive else (260, 500)
        ids = rng.integers(3, 500, 32)
        mask = np.zeros(32, dtype=np.int8)
        mask[6:14] = mask[20:30] = 1
        ids[mask == 1] = rng.integers(lo, hi, int(mask.sum()))
        rows.append(make_row(f"n{i}", ids, mask, None, 1.0 if positive else -1.0))
    return rows


def test_one_step_raises_positive_and_lowers_negative(tmp_path):
    rows = make_rows(0)
    model = tiny_model(seed=1)
    before = action_logp(copy.deepcopy(model), rows)
    cfg = TrainConfig(lr=1e-3, max_tokens_per_microbatch=64, steps_per_round=1)  # 4 micro-batches, 1 step
    trained, metrics = train_rows(model, tiny_tokenizer(), rows, cfg, tmp_path)
    after = action_logp(trained, rows)
    assert metrics["steps"] == 1 and metrics["microbatches"] == 4
    delta = after - before
    assert np.all(delta[0::2] > 0), delta  # positive advantage: more likely
    assert np.all(delta[1::2] < 0), delta  # negative advantage: less likely
