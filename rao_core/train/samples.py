"""Training rows: read a round's trained nodes, plan optimiser steps, pack micro-batches by tokens,
deal them to the ranks of a launched round.

One row per node (its whole token sequence). The loss covers only the node's own action tokens
(`action_mask`), scaled by `weighted_advantage` = depth weight x advantage (RAO Eq. 5). Token 0 of a
sequence has no context to be predicted from, so an action mask on it is ignored.

A micro-batch is laid out the way TRL's GRPO loss expects it: a shared prompt (the first `P` tokens,
`P` = the earliest first action token among its rows, so no row needs left padding and positions stay
exact) and a right-padded completion holding every action token. `tool_mask` marks the action tokens
inside the completion: observations are attended to but carry no loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from numpy.typing import ArrayLike

from rao_core.store.db import connect
from rao_core.store.sqlfiles import run_sql

COLUMNS = ("node_id", "token_ids", "action_mask", "logprobs", "weighted_advantage", "temperature")


@dataclass
class Row:
    """One trained node. `logprobs` is None for a scripted policy (no sampler log-probs)."""

    node_id: str
    token_ids: np.ndarray  # int64 (L,)
    action_mask: np.ndarray  # bool (L,), False at position 0
    logprobs: np.ndarray | None  # float32 (L,)
    weight: float  # weighted_advantage = w_d * A
    temperature: float = 1.0  # the sampler's: log-probs are under softmax(logits / temperature)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def action_tokens(self) -> int:
        return int(self.action_mask.sum())

    @property
    def first_action(self) -> int:
        return int(np.argmax(self.action_mask))


def make_row(
    node_id: str,
    token_ids: ArrayLike,
    action_mask: ArrayLike,
    logprobs: ArrayLike | None,
    weight: float,
    temperature: float | None = 1.0,
) -> Row:
    """Validate and convert one node; raises ValueError on inconsistent lengths. `temperature` is
    the sampling temperature recorded with the node: 0 (greedy) means log-probs at 1, and None
    (rows written before the column existed) means 1, the only value those runs trained at."""
    ids = np.asarray(token_ids, dtype=np.int64)
    mask = np.asarray(action_mask, dtype=bool).copy()
    if len(mask) != len(ids):
        raise ValueError(f"{node_id}: action_mask has {len(mask)} entries for {len(ids)} tokens")
    lp = None
    if logprobs is not None and len(logprobs) > 0:
        lp = np.asarray(logprobs, dtype=np.float32)
        if len(lp) != len(ids):
            raise ValueError(f"{node_id}: logprobs has {len(lp)} entries for {len(ids)} tokens")
    if len(mask):
        mask[0] = False
    return Row(node_id, ids, mask, lp, float(weight), float(temperature) if temperature else 1.0)


def rows_from_table(table: pa.Table) -> list[Row]:
    """Rows of a `samples`-shaped Arrow table, sorted by node_id so a round always trains alike."""
    cols = {c: table.column(c).to_pylist() for c in COLUMNS}
    rows = [make_row(*(cols[c][i] for c in COLUMNS)) for i in range(table.num_rows)]
    return sorted(rows, key=lambda r: r.node_id)


def read_rows(run_dir: str | Path, round: int) -> list[Row]:
    """The round's trained nodes from the `samples` view (nodes JOIN scores WHERE trained)."""
    con = connect(run_dir)
    try:
        return rows_from_table(run_sql(con, "train_rows", {"round": round}).to_arrow_table())
    finally:
        con.close()


def logprob_temperature(rows: list[Row]) -> float:
    """The one temperature the round's log-probs were sampled at; the trainer's log-probs are taken
    at it too, so the importance ratio compares like with like. Rows of several temperatures in one
    round are refused: they would need several training temperatures."""
    temps = sorted({r.temperature for r in rows if r.logprobs is not None} or {r.temperature for r in rows})
    if len(temps) > 1:
        raise ValueError(f"training rows were sampled at several temperatures {temps}: train them apart")
    return temps[0] if temps else 1.0


def pack(rows: list[Row], idx: list[int], max_tokens: int) -> list[list[int]]:
    """Greedy packing, longest first: a micro-batch's padded size (rows x longest) stays under the budget.

    Sorting by length keeps padding small; a row longer than the budget gets a micro-batch of its own.
    """
    order = sorted(idx, key=lambda i: (-rows[i].length, i))
    bins: list[list[int]] = []
    for i in order:
        if bins and (len(bins[-1]) + 1) * rows[bins[-1][0]].length <= max_tokens:
            bins[-1].append(i)
        else:
            bins.append([i])
    return bins


def _split_largest(rows: list[Row], bins: list[list[int]]) -> bool:
    """Halve the micro-batch with the most tokens; False when every micro-batch holds one row."""
    splittable = [b for b in bins if len(b) > 1]
    if not splittable:
        return False
    b = max(splittable, key=lambda b: sum(rows[i].length for i in b))
    bins.remove(b)
    bins += [b[: len(b) // 2], b[len(b) // 2 :]]
    return True


def plan_steps(rows: list[Row], max_tokens: int, steps: int, seed: int) -> list[list[list[int]]]:
    """Optimiser steps -> micro-batches -> row indices.

    With `steps` = 1 (the reference) one step covers the whole batch. With more, micro-batches are
    split until their number divides evenly, shuffled with `seed`, and dealt into `steps` mini-batches
    of equal micro-batch count (the trainer's gradient accumulation is one fixed number). Rows without
    a trainable action token are left out.
    """
    idx = [i for i, r in enumerate(rows) if r.action_tokens > 0]
    if not idx:
        return []
    bins = pack(rows, idx, max_tokens)
    while len(bins) < steps or len(bins) % steps:
        if not _split_largest(rows, bins):
            break
    random.Random(seed).shuffle(bins)
    per_step = -(-len(bins) // steps)
    return [bins[k : k + per_step] for k in range(0, len(bins), per_step)]


def collate(rows: list[Row], pad_id: int, num_items: float) -> dict[str, torch.Tensor]:
    """One micro-batch as TRL's `_compute_loss` inputs (see the module docstring).

    `num_items_in_batch` is what TRL divides the summed token loss by (for cispo/dapo/vespo): the
    caller passes the step's action-token count, rescaled so TRL's own accumulation factor cancels.
    """
    p = min(r.first_action for r in rows)
    width = max(r.length for r in rows) - p
    b = len(rows)
    completion = torch.full((b, width), pad_id, dtype=torch.long)
    attend = torch.zeros((b, width), dtype=torch.long)
    act = torch.zeros((b, width), dtype=torch.long)
    old = torch.zeros((b, width), dtype=torch.float32)
    for j, r in enumerate(rows):
        n = r.length - p
        completion[j, :n] = torch.from_numpy(r.token_ids[p:])
        attend[j, :n] = 1
        act[j, :n] = torch.from_numpy(r.action_mask[p:].astype(np.int64))
        if r.logprobs is not None:
            old[j, :n] = torch.from_numpy(r.logprobs[p:])
    return {
        "prompt_ids": torch.from_numpy(np.stack([r.token_ids[:p] for r in rows])),
        "prompt_mask": torch.ones((b, p), dtype=torch.long),
        "completion_ids": completion,
        "completion_mask": attend,
        "tool_mask": act,
        "advantages": torch.tensor([r.weight for r in rows], dtype=torch.float32),
        "old_per_token_logps": old,
        "sampler_missing": torch.tensor([r.logprobs is None for r in rows]),
        "num_items_in_batch": torch.tensor(float(num_items)),
    }


def microbatches(rows: list[Row], plan: list[list[list[int]]], pad_id: int) -> list[dict[str, torch.Tensor]]:
    """Collate every micro-batch of the plan, in training order.

    TRL divides the cispo/dapo loss by `num_items_in_batch * n_this_step / grad_accum`, where
    `grad_accum` is the plan's micro-batches per step and `n_this_step` the ones actually in this
    step (fewer in a short last step); passing `N_step * grad_accum / n_this_step` makes the divisor
    exactly `N_step`, the step's action-token count: the accumulated gradient is the gradient of the
    token mean over the whole step.
    """
    accum = max(len(step) for step in plan)
    out = []
    for step in plan:
        n_step = sum(rows[i].action_tokens for mb in step for i in mb)
        for mb in step:
            out.append(collate([rows[i] for i in mb], pad_id, n_step * accum / len(step)))
    return out


def rank_batches(
    rows: list[Row], plan: list[list[list[int]]], pad_id: int, rank: int = 0, world_size: int = 1
) -> list[dict[str, torch.Tensor]]:
    """This rank's micro-batches of every optimiser step, in training order.

    Rank r takes micro-batches r, r+W, r+2W, ... of each step. Every rank must run the same number
    per step, ceil(n/W) (DDP's gradient sync and TRL's metric collectives pair up call by call), so a
    rank short of one runs a filler: the step's shortest row with its loss mask and advantage zeroed,
    which adds exactly zero to the loss and the gradient.

    `num_items_in_batch` is the step's GLOBAL action-token count N, rescaled as in
    `samples.microbatches`: TRL divides the summed token loss by `num_items * k / grad_accum / W`
    (k = this step's micro-batches per rank), i.e. by N / W, and DDP averages the gradients of the W
    ranks, so the all-reduced gradient is the gradient of the token mean over the whole step, the one
    a single process computes. With W = 1 this is exactly `samples.microbatches`.
    """
    accum = max(-(-len(step) // world_size) for step in plan)
    out = []
    for step in plan:
        n_step = sum(rows[i].action_tokens for mb in step for i in mb)
        per_rank = -(-len(step) // world_size)
        num_items = n_step * accum / per_rank
        mine = step[rank::world_size]
        out += [collate([rows[i] for i in mb], pad_id, num_items) for mb in mine]
        for _ in range(per_rank - len(mine)):
            shortest = min((i for mb in step for i in mb), key=lambda i: (rows[i].length, i))
            filler = collate([rows[shortest]], pad_id, num_items)
            filler["tool_mask"].zero_()
            filler["advantages"].zero_()
            out.append(filler)
    return out
