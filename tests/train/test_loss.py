"""The trainer's loss and gradients against the plain-PyTorch reference (tests/train/__init__.py)."""

from __future__ import annotations

import copy
import math
import sys

import numpy as np
import pytest
import torch

from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.train.samples import Row, microbatches, pack, plan_steps
from rao_core.train.trainer import RAOTrainer, TrainConfig, train_rows
from tests.train import (
    GradCapture,
    assert_grads_close,
    one_thread,  # noqa: F401 (autouse fixture)
    random_rows,
    reference_grads,
    reference_kl,
    reference_loss,
    tiny_model,
    with_sampler_logprobs,
)

# lr = 0 and no clipping: the optimiser leaves the model alone, so the captured gradient is exactly
# the gradient of the loss at the model the reference sees.
PROBE = dict(lr=0.0, max_grad_norm=0.0, weight_decay=0.0, max_tokens_per_microbatch=10_000, steps_per_round=1)


def trainer_grads(model, rows, tmp_path, **over):
    cap = GradCapture()
    _, metrics = train_rows(model, tiny_tokenizer(), rows, TrainConfig(**{**PROBE, **over}), tmp_path, [cap])
    return metrics, cap.steps


def check_against_reference(rows: list[Row], tmp_path, cap: float = 5.0, **over) -> dict:
    model = tiny_model()
    ref_loss, ref = reference_grads(copy.deepcopy(model), rows, cap)
    metrics, steps = trainer_grads(model, rows, tmp_path, clip_high=cap, **over)
    assert len(steps) == 1
    assert metrics["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-5)
    assert_grads_close(steps[0], ref)
    return metrics


def test_on_policy_ratio_one_matches_reference(tmp_path):
    model = tiny_model()
    rows = with_sampler_logprobs(model, random_rows(6, seed=1))
    metrics = check_against_reference(rows, tmp_path)
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clipped_fraction"] == 0.0
    assert metrics["action_tokens"] == sum(r.action_tokens for r in rows)


def test_scripted_rows_without_logprobs_use_ratio_one(tmp_path):
    model = tiny_model()
    sampled = with_sampler_logprobs(model, random_rows(6, seed=2))
    rows = [
        r if i % 2 else Row(r.node_id, r.token_ids, r.action_mask, None, r.weight)
        for i, r in enumerate(sampled)
    ]
    metrics = check_against_reference(rows, tmp_path)
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-4)


def test_off_policy_ratios_with_clipping_match_reference(tmp_path):
    model = tiny_model()
    rng = np.random.default_rng(3)
    shift = rng.uniform(-2.5, 2.5, size=(4, 64)).astype(np.float32)  # ratios e^-2.5 .. e^2.5 (cap 5 < e^2.5)
    rows = with_sampler_logprobs(model, random_rows(8, seed=3), shift)
    metrics = check_against_reference(rows, tmp_path)
    assert 0.05 < metrics["clipped_fraction"] < 0.6
    assert metrics["mean_ratio"] > 1.2
    # clipping is active: without the cap the gradient is a different one
    _, capped = reference_grads(copy.deepcopy(model), rows, cap=5.0)
    _, uncapped = reference_grads(copy.deepcopy(model), rows, cap=math.inf)
    assert not torch.allclose(capped["model.norm.weight"], uncapped["model.norm.weight"], rtol=1e-3)


def test_other_clip_cap_is_passed_through(tmp_path):
    model = tiny_model()
    shift = np.full((1, 64), 1.0, dtype=np.float32)  # every ratio e^1 = 2.72
    rows = with_sampler_logprobs(model, random_rows(4, seed=4), shift)
    metrics = check_against_reference(rows, tmp_path, cap=2.0)
    assert metrics["clipped_fraction"] == pytest.approx(1.0)


def test_masked_tokens_get_no_gradient(tmp_path, monkeypatch):
    """The gradient reaching each completion position's log-prob is zero off the action mask."""
    seen = []
    original = RAOTrainer._get_per_token_logps_and_entropies

    def spy(self, *args, **kwargs):
        logps, ent, aux = original(self, *args, **kwargs)
        if logps.requires_grad:
            logps.register_hook(lambda g: seen.append(g.detach().clone()))
            seen.append(dict(self._inputs))
        return logps, ent, aux

    monkeypatch.setattr(RAOTrainer, "_get_per_token_logps_and_entropies", spy)
    rows = random_rows(5, seed=5, weights=[1.0, -2.0, 0.5, 1.0, -1.0])
    trainer_grads(tiny_model(), rows, tmp_path, max_tokens_per_microbatch=60)
    assert len(seen) >= 4 and len(seen) % 2 == 0
    for inputs, grad in zip(seen[0::2], seen[1::2], strict=True):
        trained = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
        assert torch.all(grad[~trained] == 0)
        assert torch.all(grad[trained] != 0)
        # d loss / d log pi = -A_w / N on every action token (ratio 1)
        expected = -inputs["advantages"][:, None].expand_as(grad)[trained] / inputs["num_items_in_batch"]
        torch.testing.assert_close(grad[trained], expected)


def test_advantages_and_depth_weights_scale_gradients(tmp_path):
    base = random_rows(4, seed=6, weights=[1.0, 1.0, 1.0, 1.0])
    n = sum(r.action_tokens for r in base)

    def grads(weights, rows=base):
        rs = [Row(r.node_id, r.token_ids, r.action_mask, None, w) for r, w in zip(rows, weights, strict=True)]
        return trainer_grads(tiny_model(), rs, tmp_path)[1][0]

    g_a = grads([1.0, 0.0, 0.0, 0.0])
    g_b = grads([0.0, 0.0, -2.0, 0.0])
    g_ab = grads([1.0, 0.0, -2.0, 0.0])
    for k in g_ab:  # linear in the weights: w_d * A scales each node's own term
        torch.testing.assert_close(g_ab[k], g_a[k] + g_b[k], rtol=1e-4, atol=1e-7)
    g_a3 = grads([3.0, 0.0, 0.0, 0.0])
    for k in g_a:
        torch.testing.assert_close(g_a3[k], 3 * g_a[k], rtol=1e-4, atol=1e-7)
    # a zero-weight node adds no gradient of its own but its tokens count in the token mean
    g_alone = grads([1.0], rows=base[:1])
    scale = base[0].action_tokens / n
    for k in g_a:
        torch.testing.assert_close(g_a[k], scale * g_alone[k], rtol=1e-4, atol=1e-7)


def test_one_microbatch_equals_many(tmp_path):
    model = tiny_model()
    rows = with_sampler_logprobs(model, random_rows(9, seed=7), np.full((1, 64), 0.3, dtype=np.float32))
    m1, g1 = trainer_grads(copy.deepcopy(model), rows, tmp_path, max_tokens_per_microbatch=10_000)
    m5, g5 = trainer_grads(copy.deepcopy(model), rows, tmp_path, max_tokens_per_microbatch=70)
    assert m1["microbatches"] == 1 and m5["microbatches"] >= 5
    assert m5["loss"] == pytest.approx(m1["loss"], rel=1e-5)
    assert len(g1) == len(g5) == 1
    assert_grads_close(g5[0], g1[0])
    assert_grads_close(g1[0], reference_grads(copy.deepcopy(model), rows)[1])


def test_steps_per_round_gives_several_steps_each_a_token_mean(tmp_path):
    model = tiny_model()
    rows = random_rows(8, seed=8)
    metrics, steps = trainer_grads(model, rows, tmp_path, steps_per_round=2, max_tokens_per_microbatch=80)
    assert metrics["steps"] == len(steps) == 2
    assert len(metrics["step_losses"]) == 2


def test_loss_types_pass_through(tmp_path):
    rows = random_rows(4, seed=9)
    for loss_type in ("dapo", "grpo"):
        metrics, steps = trainer_grads(tiny_model(), rows, tmp_path, loss_type=loss_type)
        assert metrics["loss_type"] == loss_type and math.isfinite(metrics["loss"]) and len(steps) == 1
    # at ratio 1 dapo's gradient is CISPO's: -A * grad(ratio) = -A * grad(log pi), same token mean
    _, cispo = trainer_grads(tiny_model(), rows, tmp_path, loss_type="cispo")
    _, dapo = trainer_grads(tiny_model(), rows, tmp_path, loss_type="dapo")
    assert_grads_close(dapo[0], cispo[0])


def test_kl_term_toward_a_reference_matches_reference(tmp_path):
    """train.beta > 0: CISPO plus beta * k3 * ratio against another model, off-policy rows."""
    model, ref_model = tiny_model(seed=0), tiny_model(seed=1)
    rng = np.random.default_rng(12)
    shift = rng.uniform(-1.0, 1.0, size=(3, 64)).astype(np.float32)
    rows = with_sampler_logprobs(model, random_rows(6, seed=12), shift)
    ref_loss, ref = reference_grads(copy.deepcopy(model), rows, beta=0.5, ref_model=ref_model)
    _, plain = reference_grads(copy.deepcopy(model), rows)
    cfg = TrainConfig(**{**PROBE, "beta": 0.5})
    cap = GradCapture()
    _, metrics = train_rows(model, tiny_tokenizer(), rows, cfg, tmp_path, [cap], reference=ref_model)
    assert metrics["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-5)
    assert_grads_close(cap.steps[0], ref)
    assert metrics["kl_to_reference"] == pytest.approx(reference_kl(model, ref_model, rows), rel=1e-4)
    assert metrics["kl_to_reference"] > 0.01
    # the term is live: without it the gradient is another one
    assert not torch.allclose(plain["model.norm.weight"], ref["model.norm.weight"], rtol=1e-3)


def test_kl_to_itself_adds_nothing(tmp_path):
    """pi_ref = pi: k3 and its gradient are 0, so the update is the plain one."""
    model = tiny_model()
    rows = random_rows(5, seed=13)
    _, plain = trainer_grads(copy.deepcopy(model), rows, tmp_path)
    cap = GradCapture()
    cfg = TrainConfig(**{**PROBE, "beta": 2.0})
    _, metrics = train_rows(
        copy.deepcopy(model), tiny_tokenizer(), rows, cfg, tmp_path, [cap], reference=copy.deepcopy(model)
    )
    assert metrics["kl_to_reference"] == pytest.approx(0.0, abs=1e-6)
    assert_grads_close(cap.steps[0], plain[0])


def test_kl_without_a_reference_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"train\.beta > 0 needs a reference model"):
        train_rows(tiny_model(), tiny_tokenizer(), random_rows(2), TrainConfig(beta=0.1), tmp_path)


def test_lora_without_peft_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # as if the lora extra were not installed
    with pytest.raises(ImportError, match=r"peft: pip install -e '\.\[lora\]'"):
        train_rows(tiny_model(), tiny_tokenizer(), random_rows(2), TrainConfig(lora=True), tmp_path)


def test_reference_loss_is_the_token_mean():
    """Sanity of the reference itself on a hand-checkable case: one row, weight 2, ratio 1."""
    model = tiny_model()
    row = random_rows(1, seed=10, weights=[2.0])[0]
    from tests.train import reference_token_logps

    logp = reference_token_logps(model, row).detach()
    mask = torch.as_tensor(row.action_mask[1:])
    expected = -(2.0 * logp[mask]).mean()
    torch.testing.assert_close(reference_loss(model, [row]).detach(), expected)


def test_packing_respects_budget_and_keeps_every_row():
    rows = random_rows(30, seed=11, lengths=(5, 60))
    bins = pack(rows, list(range(30)), max_tokens=100)
    assert sorted(i for b in bins for i in b) == list(range(30))
    for b in bins:
        assert len(b) == 1 or len(b) * max(rows[i].length for i in b) <= 100
    plan = plan_steps(rows, 100, steps=3, seed=0)
    assert len(plan) == 3 and len({len(s) for s in plan}) == 1
    assert sorted(i for s in plan for b in s for i in b) == list(range(30))
    # rows without a trainable action token are left out
    empty = Row("x", np.arange(5), np.zeros(5, dtype=bool), None, 1.0)
    assert plan_steps([empty], 100, 1, 0) == []


def test_collated_microbatch_layout():
    rows = random_rows(3, seed=12)
    plan = plan_steps(rows, 10_000, 1, 0)
    (mb,) = microbatches(rows, plan, pad_id=0)
    p = mb["prompt_ids"].shape[1]
    assert p == min(r.first_action for r in rows)
    assert int((mb["completion_mask"] * mb["tool_mask"]).sum()) == sum(r.action_tokens for r in rows)
    assert float(mb["num_items_in_batch"]) == sum(r.action_tokens for r in rows)
    for j, r in enumerate(sorted(rows, key=lambda r: -r.length)):
        full = torch.cat([mb["prompt_ids"][j], mb["completion_ids"][j][: r.length - p]])
        assert torch.equal(full, torch.as_tensor(r.token_ids))


def test_gradient_checkpointing_gives_the_same_gradient(tmp_path):
    rows = random_rows(4, seed=13)
    _, plain = trainer_grads(tiny_model(), rows, tmp_path)
    _, ckpt = trainer_grads(tiny_model(), rows, tmp_path, gradient_checkpointing=True)
    assert_grads_close(ckpt[0], plain[0])
