"""Helpers of the training tests: a tiny Qwen3 model, synthetic rows, and an independent reference.

The reference is the RAO loss written directly in plain PyTorch from rao-method.md, one unpadded
sequence at a time: loss = -sum over action tokens of sg(clip(ratio, 0, cap)) * A_w * log pi, divided
by the number of action tokens in the batch, ratio = exp(log pi - log pi_sampler). It shares no code
with the trainer (no TRL, no packing, no padding).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, TrainerCallback

from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.train.samples import Row, make_row

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run several times faster on one thread, above all on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_model(seed: int = 0, vocab: int | None = None) -> Qwen3ForCausalLM:
    """Hidden 64, 2 layers, float32: builds in milliseconds, deterministic for a seed."""
    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab or len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(cfg).float().eval()


def random_rows(
    n: int, seed: int = 0, lengths: tuple[int, int] = (12, 40), weights: list[float] | None = None
) -> list[Row]:
    """Rows shaped like node conversations: prompt, action, observation, action, ...; no sampler log-probs."""
    rng = np.random.default_rng(seed)
    vocab = len(tiny_tokenizer())
    rows = []
    for i in range(n):
        length = int(rng.integers(*lengths))
        ids = rng.integers(3, vocab, length)
        mask = np.zeros(length, dtype=np.int8)
        pos = int(rng.integers(3, 8))  # prompt of 3..7 tokens
        while pos < length:
            span = int(rng.integers(2, 7))
            mask[pos : pos + span] = 1  # an action
            pos += span + int(rng.integers(1, 6))  # then an observation
        w = weights[i] if weights is not None else float(rng.choice([-1.5, -0.5, 0.25, 1.0, 2.0]))
        rows.append(make_row(f"n{i:03d}", ids, mask, None, w))
    return rows


def reference_token_logps(model: torch.nn.Module, row: Row) -> torch.Tensor:
    """log pi(token_t | tokens_<t) for t = 1..L-1, one unpadded sequence (with gradient)."""
    ids = torch.as_tensor(row.token_ids)[None]
    logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]


def reference_loss(
    model: torch.nn.Module,
    rows: list[Row],
    cap: float = 5.0,
    beta: float = 0.0,
    ref_model: torch.nn.Module | None = None,
) -> torch.Tensor:
    """The RAO/CISPO token-mean loss of rows, straight from the equations.

    With `beta`, plus beta * k3 * ratio per action token, k3 = exp(d) - d - 1 with
    d = log pi_ref - log pi, and ratio = exp(log pi - log pi_sampler) NOT detached (the unbiased
    reverse-KL gradient of DeepSeek-V3.2, TRL's default)."""
    total = torch.zeros(())
    n_tokens = 0
    for r in rows:
        logp = reference_token_logps(model, r)
        mask = torch.as_tensor(r.action_mask[1:], dtype=torch.bool)
        old = logp.detach() if r.logprobs is None else torch.as_tensor(r.logprobs[1:])
        ratio = torch.exp(logp.detach() - old)
        w = torch.clamp(ratio, 0.0, cap)  # detached: stop-gradient
        total = total - (w * r.weight * logp)[mask].sum()
        if beta:
            d = reference_token_logps(ref_model, r).detach() - logp
            total = total + beta * ((torch.exp(d) - d - 1) * torch.exp(logp - old))[mask].sum()
        n_tokens += int(mask.sum())
    return total / n_tokens


def reference_kl(model: torch.nn.Module, ref_model: torch.nn.Module, rows: list[Row]) -> float:
    """Mean k3 estimate of KL(pi || pi_ref) over the action tokens of rows."""
    total, n = 0.0, 0
    with torch.no_grad():
        for r in rows:
            mask = torch.as_tensor(r.action_mask[1:], dtype=torch.bool)
            d = reference_token_logps(ref_model, r) - reference_token_logps(model, r)
            total += float((torch.exp(d) - d - 1)[mask].sum())
            n += int(mask.sum())
    return total / n


def reference_grads(
    model: torch.nn.Module, rows: list[Row], cap: float = 5.0, **kl: object
) -> tuple[float, dict]:
    model.zero_grad()
    loss = reference_loss(model, rows, cap, **kl)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return float(loss.detach()), grads


def with_sampler_logprobs(
    model: torch.nn.Module, rows: list[Row], shift: np.ndarray | None = None
) -> list[Row]:
    """Copies of rows whose sampler log-probs are the model's own, minus `shift` per token (off-policy)."""
    out = []
    with torch.no_grad():
        for k, r in enumerate(rows):
            lp = np.zeros(r.length, dtype=np.float32)
            lp[1:] = reference_token_logps(model, r).numpy()
            if shift is not None:
                lp[1:] -= shift[k % len(shift)][: r.length - 1]
            lp[~r.action_mask] = 0.0
            out.append(Row(r.node_id, r.token_ids, r.action_mask, lp, r.weight))
    return out


class GradCapture(TrainerCallback):
    """Keeps the accumulated gradient of every optimiser step (before the optimiser touches it)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
        self.steps.append(
            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        )


def assert_grads_close(a: dict, b: dict, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
