"""The off-policy corrections (train.token_mask, sequence_mask, proximal_anchor) and the KL guard
against plain-Python references, on stale trees: rows sampled by an older version of the model."""

from __future__ import annotations

import copy
import dataclasses
import math
import random

import numpy as np
import pytest
import torch

from rao_core.config import TrainConfig
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.train.offpolicy import behaviour_weights, kl_guard, trust_region_mask
from rao_core.train.samples import Row, plan_steps
from rao_core.train.trainer import train_rows
from tests.train import (
    GradCapture,
    assert_grads_close,
    one_thread,  # noqa: F401 (autouse fixture)
    random_rows,
    reference_token_logps,
    tiny_model,
    with_sampler_logprobs,
)

PROBE = dict(lr=0.0, max_grad_norm=0.0, weight_decay=0.0, max_tokens_per_microbatch=10_000, steps_per_round=1)
SETTINGS = [
    dict(token_mask=1.3),
    dict(sequence_mask=1.05),
    dict(proximal_anchor=True, behaviour_cap=1.2),
    dict(token_mask=1.5, sequence_mask=1.1, proximal_anchor=True, behaviour_cap=1.5),
    dict(trust_region=0.2),
    dict(token_mask=1.5, sequence_mask=1.1, proximal_anchor=True, behaviour_cap=1.5, trust_region=0.1),
]
IDS = ["token", "sequence", "anchor", "all", "trust", "all-trust"]


def ref_weights(prox: list[float], mu: list[float], mask: list[bool], s: dict) -> tuple[list[float], dict]:
    """One node's token weights, straight from the definitions (plain floats)."""
    lr = [p - m if a else 0.0 for p, m, a in zip(prox, mu, mask, strict=True)]
    w = [1.0] * len(lr)
    counts = {"token_masked": 0, "sequence_masked": 0, "truncated": 0}
    if s.get("token_mask"):
        c = s["token_mask"]
        for t, a in enumerate(mask):
            if a and not (1 / c <= math.exp(lr[t]) <= c):
                w[t], counts["token_masked"] = 0.0, counts["token_masked"] + 1
    n = sum(mask)
    if s.get("sequence_mask") and n and abs(sum(lr) / n) > math.log(s["sequence_mask"]):
        w, counts["sequence_masked"] = [0.0] * len(w), n
    if s.get("proximal_anchor"):
        cap = s.get("behaviour_cap", 2.0)
        counts["truncated"] = sum(1 for t, a in enumerate(mask) if a and math.exp(lr[t]) > cap)
        w = [x * min(math.exp(d), cap) for x, d in zip(w, lr, strict=True)]
    return w, counts


def ref_trust(cur: list[float], old: list[float], adv: float, mask: list[bool], eps: float) -> list[bool]:
    """One node's tokens outside PPO's trust region: the clipped side of min(r A, clip(r) A)."""
    out = []
    for c, o, a in zip(cur, old, mask, strict=True):
        r = math.exp(c - o)
        out.append(a and ((adv > 0 and r > 1 + eps) or (adv < 0 and r < 1 - eps)))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_trust_region_matches_the_reference(seed):
    rng = random.Random(seed)
    b, t, eps = 6, 15, rng.choice([0.05, 0.2, 0.5])
    old = [[rng.gauss(-2, 1) for _ in range(t)] for _ in range(b)]
    cur = [[o + rng.gauss(0, rng.choice([0.05, 0.3, 1.0])) for o in row] for row in old]
    adv = [rng.choice([-1.5, -0.2, 0.0, 0.3, 2.0]) for _ in range(b)]
    adv[2] = 0.0  # a node with no advantage: never masked
    mask = [[rng.random() < 0.6 for _ in range(t)] for _ in range(b)]
    mask[0] = [False] * t
    got = trust_region_mask(
        torch.tensor(cur, dtype=torch.float64), torch.tensor(old, dtype=torch.float64),
        torch.tensor(adv), torch.tensor(mask), eps,
    )  # fmt: skip
    want = [ref_trust(cur[i], old[i], adv[i], mask[i], eps) for i in range(b)]
    assert got.tolist() == want
    assert any(any(row) for row in want)  # the draw reaches the clipped side somewhere


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("settings", SETTINGS[:4], ids=IDS[:4])
def test_weights_match_the_reference_on_random_batches(seed, settings):
    rng = random.Random(seed)
    b, t = 5, 17
    prox = [[rng.gauss(-2, 1) for _ in range(t)] for _ in range(b)]
    stale = rng.choice([0.05, 0.3, 1.0])  # how far the sampler's version is
    mu = [[p + rng.gauss(0, stale) for p in row] for row in prox]
    mask = [[rng.random() < 0.6 for _ in range(t)] for _ in range(b)]
    mask[0] = [False] * t  # a node with no action token
    mu[1] = list(prox[1])  # a node sampled by this very version (or scripted): ratio 1
    weight, counts = behaviour_weights(
        torch.tensor(prox), torch.tensor(mu), torch.tensor(mask), TrainConfig(**settings)
    )
    total = {"token_masked": 0, "sequence_masked": 0, "truncated": 0}
    for i in range(b):
        w, c = ref_weights(prox[i], mu[i], mask[i], settings)
        got = [weight[i, j].item() for j in range(t) if mask[i][j]]
        assert got == pytest.approx([w[j] for j in range(t) if mask[i][j]], rel=1e-5, abs=1e-6)
        total = {k: total[k] + c[k] for k in total}
    assert counts == {k: float(v) for k, v in total.items()}


def ref_corrected_loss(
    model, rows: list[Row], prox: dict[str, torch.Tensor], s: dict, cap: float, dapo: tuple | None = None
) -> torch.Tensor:
    """The RAO/CISPO token mean with the corrections, one unpadded node at a time: weight x
    sg(min(pi / base, cap)) x A_w x log pi, base = pi_prox under the anchor, else the sampler's mu.
    `dapo=(eps_low, eps_high)`: the grpo family's -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    with r = pi / base instead."""
    total, n = torch.zeros(()), 0
    for r in rows:
        logp = reference_token_logps(model, r)
        mask = [bool(a) for a in r.action_mask[1:]]
        p = prox[r.node_id]
        mu = p if r.logprobs is None else torch.as_tensor(r.logprobs[1:])
        w, _ = ref_weights(p.tolist(), mu.tolist(), mask, s)
        base = p if s.get("proximal_anchor") else mu
        if s.get("trust_region"):
            out = ref_trust(logp.tolist(), base.tolist(), r.weight, mask, s["trust_region"])
            w = [0.0 if o else x for x, o in zip(w, out, strict=True)]
        if dapo:
            ratio = torch.exp(logp - base)
            per_token = -torch.min(ratio * r.weight, torch.clamp(ratio, 1 - dapo[0], 1 + dapo[1]) * r.weight)
        else:
            per_token = -torch.clamp(torch.exp(logp.detach() - base), max=cap) * r.weight * logp
        m = torch.as_tensor(mask)
        total = total + (torch.as_tensor(w) * per_token)[m].sum()
        n += int(m.sum())
    return total / n


def stale_rows(model, n: int, seed: int) -> list[Row]:
    """Rows sampled by an older version: the model's weights nudged back, some rows scripted."""
    older = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in older.parameters():
            p.add_(1.0 * p.std() * torch.randn(p.shape, generator=gen))
    rows = with_sampler_logprobs(older, random_rows(n, seed=seed))
    rows[1] = Row(rows[1].node_id, rows[1].token_ids, rows[1].action_mask, None, rows[1].weight)  # scripted
    return rows


def own_logps(model, rows: list[Row]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {r.node_id: reference_token_logps(model, r) for r in rows}


@pytest.mark.parametrize("settings", SETTINGS, ids=IDS)
def test_the_corrected_loss_and_gradient_match_the_reference(settings, tmp_path):
    model = tiny_model()
    rows = stale_rows(model, 8, seed=11)
    ref_model = copy.deepcopy(model)
    loss = ref_corrected_loss(ref_model, rows, own_logps(model, rows), settings, cap=5.0)
    loss.backward()
    ref = {k: p.grad for k, p in ref_model.named_parameters() if p.grad is not None}
    cap = GradCapture()
    _, metrics = train_rows(model, tiny_tokenizer(), rows, TrainConfig(**PROBE, **settings), tmp_path, [cap])
    assert metrics["loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-5)
    assert_grads_close(cap.steps[0], ref)
    touched = sum(
        metrics.get(k, 0.0)
        for k in (
            "token_masked_fraction",
            "sequence_masked_fraction",
            "truncated_fraction",
            "trust_masked_fraction",
        )
    )
    assert 0 < touched < 3  # the stale rows are far enough for every correction to act on some tokens


def test_later_steps_use_the_version_the_round_started_from(tmp_path):
    """steps_per_round=2, lr > 0: step 2's gradient is the reference's with pi_prox from the model
    before step 1 and pi from the model after it (the pre-pass's log-probs reach the right rows)."""
    settings = dict(
        token_mask=1.5, sequence_mask=1.1, proximal_anchor=True, behaviour_cap=1.5, trust_region=0.02
    )
    model = tiny_model()
    rows = stale_rows(model, 10, seed=12)
    prox = own_logps(model, rows)

    class AfterFirst(GradCapture):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
            super().on_pre_optimizer_step(args, state, control, model=model, **kwargs)
            if state.global_step == 1:  # a plain copy (TRL's fused head patches the model it trains)
                self.model = tiny_model()
                self.model.load_state_dict(model.state_dict())

    cap = AfterFirst()
    cfg = TrainConfig(
        **{**PROBE, "lr": 1e-2, "steps_per_round": 2, "max_tokens_per_microbatch": 200}, **settings
    )
    _, metrics = train_rows(model, tiny_tokenizer(), rows, cfg, tmp_path, [cap])
    assert metrics["trust_masked_fraction"] > 0  # step 2's pi left the region around pi_prox somewhere
    plan = plan_steps(rows, cfg.max_tokens_per_microbatch, cfg.steps_per_round, cfg.seed)
    second = [rows[i] for mb in plan[1] for i in mb]
    moved = cap.model
    loss = ref_corrected_loss(moved, second, prox, settings, cap=5.0)
    loss.backward()
    ref = {k: p.grad for k, p in moved.named_parameters() if p.grad is not None}
    assert_grads_close(cap.steps[1], ref, rtol=1e-3, atol=1e-5)
    # with pi_prox taken from the moved model instead, the gradient differs: the anchor is the start
    stale_anchor = tiny_model()
    stale_anchor.load_state_dict(cap.model.state_dict())
    wrong = ref_corrected_loss(stale_anchor, second, own_logps(cap.model, second), settings, cap=5.0)
    wrong.backward()
    name = "model.norm.weight"
    assert not torch.allclose(dict(stale_anchor.named_parameters())[name].grad, ref[name], rtol=1e-3)


def test_no_correction_is_the_uncorrected_trainer_exactly(tmp_path):
    """The defaults (trust_region and kl_guard auto, which train_rows settles as off for rows it
    takes as fresh; the rest off): the same loss and gradient, bit for bit, as before the
    corrections existed (the k = 0 path), and no correction metrics."""
    model = tiny_model()
    rows = stale_rows(model, 6, seed=13)
    a, b = GradCapture(), GradCapture()
    _, m1 = train_rows(
        copy.deepcopy(model), tiny_tokenizer(), rows, TrainConfig(**PROBE), tmp_path / "a", [a]
    )
    off = TrainConfig(**PROBE, behaviour_cap=3.0, kl_guard_factor=4.0)  # settings of corrections left off
    _, m2 = train_rows(copy.deepcopy(model), tiny_tokenizer(), rows, off, tmp_path / "b", [b])
    assert m1["loss"] == m2["loss"]
    for k in a.steps[0]:
        assert torch.equal(a.steps[0][k], b.steps[0][k])
    assert (
        not {
            "token_masked_fraction",
            "sequence_masked_fraction",
            "truncated_fraction",
            "trust_masked_fraction",
            "kl_guard_threshold",
        }
        & m2.keys()
    )


def ref_guard(kl: float, history: list[float], factor: float, ceiling: float, floor: float) -> float | None:
    if kl <= floor:
        return None
    if kl > ceiling:
        return ceiling
    if not history:
        return None
    median = float(np.median(history))
    return max(factor * median, floor) if kl > max(factor * median, floor) else None


@pytest.mark.parametrize("seed", range(20))
def test_the_guard_matches_the_reference(seed):
    rng = random.Random(seed)
    history = [10 ** rng.uniform(-5, -2) for _ in range(rng.randint(0, 6))]
    kl = 10 ** rng.uniform(-5, -0.5)
    cfg = TrainConfig(kl_guard="skip", kl_guard_factor=rng.choice([3.0, 10.0]), kl_guard_ceiling=0.05)
    expected = ref_guard(kl, history, cfg.kl_guard_factor, cfg.kl_guard_ceiling, cfg.kl_guard_floor)
    assert kl_guard(kl, history, cfg) == pytest.approx(expected)
    assert kl_guard(kl, history, TrainConfig(kl_guard="off")) is None


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_the_guard_skips_a_round_whose_kl_jumped(tmp_path):
    model = tiny_model()
    rows = stale_rows(model, 6, seed=14)
    before = params(model)
    cfg = TrainConfig(
        **{**PROBE, "lr": 1e-2, "steps_per_round": 2, "max_tokens_per_microbatch": 200}, kl_guard="skip"
    )
    out, m = train_rows(model, tiny_tokenizer(), rows, cfg, tmp_path, kl_history=[1e-4, 2e-4, 1e-4])
    assert m["mismatch_kl"] > 2e-3 and m["kl_guard_skipped"] == 1
    assert m["kl_guard_threshold"] == pytest.approx(max(10 * 1e-4, 1e-3))
    assert m["steps"] == 0 and m["skipped"].startswith("kl_guard: sampler mismatch KL")
    assert all(torch.equal(before[k], v) for k, v in params(out).items())  # not a weight moved
    # a history of rounds as far off does not trip it: the round trains
    _, calm = train_rows(
        tiny_model(), tiny_tokenizer(), rows, cfg, tmp_path / "b", kl_history=[m["mismatch_kl"]] * 3
    )
    assert "kl_guard_threshold" not in calm and calm["steps"] == 2
    # no history at all (a direct call, or the stage on fresh trees): no guard, even past the ceiling
    far = dataclasses.replace(cfg, kl_guard_ceiling=1e-6)
    _, free = train_rows(tiny_model(), tiny_tokenizer(), rows, far, tmp_path / "c")
    assert "kl_guard_threshold" not in free and free["steps"] == 2


def test_the_guard_scales_the_round_lr(tmp_path):
    """scale: the update is the one of lr x threshold / KL (AdamW's first step is proportional to lr)."""
    model = tiny_model()
    rows = stale_rows(model, 6, seed=15)
    cfg = TrainConfig(**{**PROBE, "lr": 1e-2}, kl_guard="scale", keep_optimizer_state=False)
    guarded, m = train_rows(
        copy.deepcopy(model), tiny_tokenizer(), rows, cfg, tmp_path / "a", kl_history=[1e-4]
    )
    scale = m["kl_guard_lr_scale"]
    assert 0 < scale < 1 and m["kl_guard_threshold"] / m["mismatch_kl"] == pytest.approx(scale)
    plain_cfg = TrainConfig(**{**PROBE, "lr": 1e-2 * scale}, keep_optimizer_state=False)
    plain, _ = train_rows(copy.deepcopy(model), tiny_tokenizer(), rows, plain_cfg, tmp_path / "b")
    for (k, a), b in zip(params(guarded).items(), params(plain).values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=k)


def test_dapo_clips_around_the_proximal_policy(tmp_path):
    """The grpo family under the anchor: -min(r A, clip(r, 1 - eps, 1 + eps_high) A) x weight, with
    r = pi / pi_prox, against the same written out by hand (token mean, as cispo)."""
    settings = dict(token_mask=1.5, proximal_anchor=True, behaviour_cap=1.3)
    model = tiny_model()
    rows = stale_rows(model, 8, seed=16)
    prox = own_logps(model, rows)
    ref_model = copy.deepcopy(model)
    ref_corrected_loss(ref_model, rows, prox, settings, cap=5.0, dapo=(0.2, 0.28)).backward()
    ref = {k: p.grad for k, p in ref_model.named_parameters() if p.grad is not None}
    cap = GradCapture()
    cfg = TrainConfig(**PROBE, loss_type="dapo", clip_low=0.2, clip_high=0.28, **settings)
    train_rows(model, tiny_tokenizer(), rows, cfg, tmp_path, [cap])
    assert_grads_close(cap.steps[0], ref)


def test_settings_out_of_range_are_refused_in_one_line():
    from rao_core.run import load_config

    for bad, said in (
        ("train.token_mask=1", "greater than 1"),
        ("train.sequence_mask=0.5", "greater than 1"),
        ("train.kl_guard=drop", "train.kl_guard"),
    ):
        with pytest.raises(Exception, match=said):
            load_config(overrides=[bad])
    with pytest.raises(Exception, match="vespo"):
        load_config(overrides=["train.proximal_anchor=true", "train.loss_type=vespo"])
    # YAML reads a bare `off` as False: it still means the guard's "off"
    assert load_config(overrides=["train.kl_guard=off"]).train.kl_guard == "off"
