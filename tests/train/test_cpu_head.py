"""The CPU LM head (rao_core/train/cpu_head.py) against a plain float64 log-softmax: log-probs,
entropy and the gradients of hidden states, weight and bias, over several chunks, with a
temperature, a logit scale and a soft cap; and against TRL's own function."""

from __future__ import annotations

import pytest
import torch
from trl.trainer import utils as trl_utils

from rao_core.train import cpu_head
from rao_core.train.cpu_head import CPULogProbs


def reference(hidden, weight, bias, targets, temperature, softcap, scale):
    """log p(target), entropy: the textbook way, float64."""
    z = (hidden.double() @ weight.double().t() + (0 if bias is None else bias.double())) * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    logp = torch.log_softmax(z / temperature, -1)
    return logp.gather(1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def inputs(n=23, h=16, v=50, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64).float().requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).requires_grad_() if bias else None
    return hidden, weight, b, torch.randint(0, v, (n,), generator=g)


@pytest.mark.parametrize(
    "temperature, softcap, scale, bias",
    [(1.0, None, 1.0, False), (0.7, None, 1.0, True), (1.0, 3.0, 1.0, True), (1.3, None, 0.5, False)],
)
def test_log_probs_entropy_and_gradients_equal_a_plain_log_softmax(
    monkeypatch, temperature, softcap, scale, bias
):
    monkeypatch.setattr(cpu_head, "TOKEN_CHUNK", 7)  # 23 tokens: 4 chunks, the last one short
    hidden, weight, b, targets = inputs(bias=bias)
    gl, ge = torch.randn(23, dtype=torch.float64), torch.randn(23, dtype=torch.float64)

    logp, ent, *_ = CPULogProbs.apply(
        hidden, weight, b, targets, temperature, 4096, softcap, scale, ("log_probs", "entropy")
    )
    (logp.double() * gl + ent.double() * ge).sum().backward()
    got = [hidden.grad, weight.grad] + ([b.grad] if bias else [])

    h2, w2, b2 = (t.detach().clone().requires_grad_() if t is not None else None for t in (hidden, weight, b))
    ref_logp, ref_ent = reference(h2, w2, b2, targets, temperature, softcap, scale)
    (ref_logp * gl + ref_ent * ge).sum().backward()
    want = [h2.grad, w2.grad] + ([b2.grad] if bias else [])

    torch.testing.assert_close(logp.double(), ref_logp.detach(), rtol=0, atol=2e-5)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), rtol=0, atol=2e-5)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), e.double(), rtol=1e-4, atol=1e-4)


def test_it_agrees_with_trls_function_in_bf16_autocast():
    """The trainer runs the head under bf16 autocast: both functions round the matmul's inputs to
    bf16, so they agree to bf16's precision, far closer than either is to float32."""
    hidden, weight, _, targets = inputs(n=40, h=64, v=300)
    trl_function = trl_utils._ChunkedLogProbFunction
    if isinstance(trl_function, cpu_head.DeviceLogProbs):  # rao_core.train.trainer swapped ours in
        trl_function = trl_function.trl_function
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = CPULogProbs.apply(hidden, weight, None, targets, 1.0, 4096, None, 1.0, ("log_probs",))[0]
        theirs = trl_function.apply(hidden, weight, None, targets, 1.0, 4096, None, 1.0, ("log_probs",))[0]
    exact, _ = reference(hidden, weight, None, targets, 1.0, None, 1.0)
    assert (ours.double() - theirs.double()).abs().max() < 0.05
    assert (ours.double() - exact).abs().mean() < 0.05
