"""End to end on a tiny run folder: nodes partition -> score_round -> train_round -> checkpoint."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rao_core.config import ScoringConfig
from rao_core.layout import METRICS, RunLayout
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.scoring import score_round
from rao_core.store.db import connect
from rao_core.store.parquet import write_partition
from rao_core.store.schema import NODE_SCHEMA
from rao_core.train.samples import read_rows
from rao_core.train.stage import train_round
from rao_core.train.trainer import TrainConfig
from tests.train import one_thread, tiny_model  # noqa: F401 (autouse fixture)

CFG = TrainConfig(lr=1e-3, max_tokens_per_microbatch=128, steps_per_round=1)


def node(
    task: str, g: int, path: str, parent: str | None, success: float, rng, scripted: bool, round_: int = 0
) -> dict:
    """One NODE_SCHEMA row with a random conversation: prompt, then action/observation turns."""
    length = int(rng.integers(16, 40))
    ids = rng.integers(3, len(tiny_tokenizer()), length).tolist()
    mask = [0] * 6 + [int(i % 7 < 4) for i in range(length - 6)]
    logprobs = [] if scripted else [float(-rng.uniform(0.5, 5.0)) if m else 0.0 for m in mask]
    tree = f"{task}/{g}"
    return {
        **{f.name: None for f in NODE_SCHEMA},
        "run": "r",
        "round": round_,
        "split": "train",
        "mode": "recursive",
        "suite": "textcraft",
        "task_id": task,
        "sample": g,
        "tree_id": tree,
        "node_id": f"{tree}:{path}",
        "parent_id": None if parent is None else f"{tree}:{parent}",
        "depth": path.count(".") if path != "0" else 0,
        "policy_version": round_,  # round r samples with version r (campaign.max_staleness 0)
        "status": "finished",
        "success": success,
        "tree_status": "ok",
        "token_ids": ids,
        "action_mask": mask,
        "logprobs": logprobs,
    }


def write_round(
    run_dir, successes: list[float], seed: int = 0, round_: int = 0, version: int | None = None
) -> None:
    """Two root tasks x len(successes) trees; a root has one or two children sharing its success.
    `version`: the policy version that sampled them (default: the round's own, k = 0)."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(2):
        for g, s in enumerate(successes):
            scripted = g % 2 == 1
            rows.append(node(f"t{t}", g, "0", None, s, rng, scripted, round_))
            for c in range(1 + g % 2):
                rows.append(node(f"t{t}", g, f"0.{c}", "0", s, rng, scripted, round_))
    if version is not None:
        rows = [{**r, "policy_version": version} for r in rows]
    table = pa.Table.from_pylist(rows, schema=NODE_SCHEMA)
    write_partition({"nodes": table}, RunLayout(run_dir).rollouts(round_))
    score_round(
        run_dir, round_, ScoringConfig(), max_staleness=round_ - (round_ if version is None else version)
    )


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "policy-0"
    tiny_model(seed=3).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def weights(path) -> dict[str, torch.Tensor]:
    return dict(AutoModelForCausalLM.from_pretrained(path, local_files_only=True).state_dict())


def test_train_round_writes_a_loadable_checkpoint(tmp_path, checkpoint):
    run = tmp_path / "run"
    write_round(run, [1.0, 0.0, 1.0, 0.0])
    rows = read_rows(run, 0)
    assert len(rows) == 20  # every node of every tree is trained: 8 roots, 12 children
    con = connect(run)
    expected = dict(con.sql("SELECT node_id, depth_weight * advantage FROM scores WHERE trained").fetchall())
    depth_weights = sorted(w for (w,) in con.sql("SELECT DISTINCT depth_weight FROM scores").fetchall())
    assert depth_weights == pytest.approx([10 / 12, 10 / 8])  # Eq. 4 with N_0 = 8, N_1 = 12
    assert {r.node_id: r.weight for r in rows} == pytest.approx(expected)  # weight = w_d * A
    assert sum(r.logprobs is None for r in rows) == 12  # the scripted trees

    out = tmp_path / "policy-1"
    metrics = train_round(run, 0, checkpoint, out, CFG)
    assert metrics["samples"] == metrics["trained_samples"] == 20
    assert metrics["steps"] == 1 and metrics["microbatches"] > 1 and metrics["policy_version"] == 1
    assert metrics["tokens"] == sum(r.length for r in rows)
    assert metrics["action_tokens"] == sum(r.action_tokens for r in rows)
    for key in ("loss", "grad_norm", "seconds", "tokens_per_s", "mean_ratio", "clipped_fraction"):
        assert np.isfinite(metrics[key]), key
    assert json.loads((out / METRICS).read_text())["loss"] == metrics["loss"]

    before, after = weights(checkpoint), weights(out)
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok.get_vocab() == tiny_tokenizer().get_vocab()
    assert not list(tmp_path.glob(".tmp-*"))

    # idempotent: a complete checkpoint is returned as is, nothing retrained
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert train_round(run, 0, checkpoint, out, CFG) == json.loads((out / METRICS).read_text())
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_round_without_trained_rows_copies_the_policy_forward(tmp_path, checkpoint):
    run = tmp_path / "run"
    write_round(run, [1.0, 1.0, 1.0])  # all equal: zero-advantage groups are skipped
    assert read_rows(run, 0) == []
    out = tmp_path / "policy-1"
    metrics = train_round(run, 0, checkpoint, out, CFG)
    assert metrics["skipped"] == "no trained rows" and metrics["policy_version"] == 1
    before, after = weights(checkpoint), weights(out)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert (out / METRICS).is_file()


def test_adam_moments_carry_over_from_round_to_round(tmp_path, checkpoint):
    """Round 2 resumes round 1's AdamW state (step count and moments), with round 2's own lr; a
    fresh optimiser on the same data takes a different step, so the state is really used."""
    import dataclasses

    from rao_core.checkpoints import optimizer_file

    run = tmp_path / "run"
    write_round(run, [1.0, 0.0, 1.0, 0.0])
    v1 = tmp_path / "policy-1"
    train_round(run, 0, checkpoint, v1, CFG)
    saved = torch.load(optimizer_file(v1), weights_only=True)
    assert {s["step"].item() for s in saved["state"].values()} == {1.0}  # one optimiser step
    assert saved["param_groups"][0]["lr"] == CFG.lr

    second = dataclasses.replace(CFG, lr=5e-4)
    resumed = train_round(run, 0, v1, tmp_path / "policy-2", second)
    assert resumed["resumed_optimizer"] and "optimizer_state" not in resumed
    assert optimizer_file(v1) is None  # superseded moments are dropped: only the latest are kept
    again = torch.load(optimizer_file(tmp_path / "policy-2"), weights_only=True)
    assert {s["step"].item() for s in again["state"].values()} == {2.0}  # the count went on
    assert again["param_groups"][0]["lr"] == 5e-4  # this round's hyperparameters, not the saved ones
    (v1 / "trainer_state").mkdir()  # put round 1's moments back for the comparison
    torch.save(saved, v1 / "trainer_state" / "optimizer.pt")
    fresh_cfg = dataclasses.replace(second, keep_optimizer_state=False)
    fresh = train_round(run, 0, v1, tmp_path / "policy-2-fresh", fresh_cfg)
    assert not fresh["resumed_optimizer"] and optimizer_file(tmp_path / "policy-2-fresh") is None
    a, b, start = weights(tmp_path / "policy-2"), weights(tmp_path / "policy-2-fresh"), weights(v1)
    moved_a = sum((a[k] - start[k]).abs().sum() for k in a)
    moved_b = sum((b[k] - start[k]).abs().sum() for k in b)
    assert moved_a > 0 and moved_b > 0 and not torch.allclose(moved_a, moved_b, rtol=1e-3)


def test_corrections_act_only_in_rounds_of_stale_trees(tmp_path, checkpoint):
    """train.corrections=stale_rounds (the default): a round of fresh trees (k = 0) trains exactly as
    with the corrections off; a round whose trees an older version sampled is corrected."""
    on = TrainConfig(
        lr=1e-3, max_tokens_per_microbatch=128, steps_per_round=2, token_mask=1.5, sequence_mask=1.2,
        proximal_anchor=True, trust_region=0.2, kl_guard="scale",
    )  # fmt: skip
    fresh, stale = tmp_path / "fresh", tmp_path / "stale"
    write_round(fresh, [1.0, 0.0, 1.0, 0.0], round_=1)
    write_round(stale, [1.0, 0.0, 1.0, 0.0], round_=1, version=0)
    plain = train_round(fresh, 1, checkpoint, tmp_path / "plain", dataclasses.replace(CFG, steps_per_round=2))
    kept = train_round(fresh, 1, checkpoint, tmp_path / "kept", on)
    assert kept["loss"] == plain["loss"] and kept["grad_norms"] == plain["grad_norms"]
    assert not {"token_masked_fraction", "trust_masked_fraction", "kl_guard_threshold"} & kept.keys()
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            weights(tmp_path / "plain").values(), weights(tmp_path / "kept").values(), strict=True
        )
    )
    corrected = train_round(stale, 1, checkpoint, tmp_path / "corrected", on)
    assert {
        "token_masked_fraction",
        "sequence_masked_fraction",
        "truncated_fraction",
        "trust_masked_fraction",
    } <= corrected.keys()
    # the stage hands the guard a KL history in a stale round: the rows' made-up sampler log-probs
    # are far over kl_guard_ceiling, so it scales the round's lr
    assert 0 < corrected["kl_guard_lr_scale"] < 1
    everywhere = train_round(
        fresh,
        1,
        checkpoint,
        tmp_path / "everywhere",
        dataclasses.replace(on, corrections="every_round"),
    )
    assert "token_masked_fraction" in everywhere


def test_the_defaults_correct_stale_rounds_and_leave_fresh_ones_as_they_were(tmp_path, checkpoint):
    """train.trust_region and train.kl_guard default to auto: a round of fresh trees (k = 0) trains
    bit for bit as with both off; a round of stale trees gets eps 0.3 and the guard at skip."""
    default = dataclasses.replace(CFG, steps_per_round=2)
    assert (default.trust_region, default.kl_guard) == ("auto", "auto")
    off = dataclasses.replace(default, trust_region=None, kl_guard="off")
    fresh, stale = tmp_path / "fresh", tmp_path / "stale"
    write_round(fresh, [1.0, 0.0, 1.0, 0.0], round_=1)
    write_round(stale, [1.0, 0.0, 1.0, 0.0], round_=1, version=0)
    auto = train_round(fresh, 1, checkpoint, tmp_path / "auto", default)
    plain = train_round(fresh, 1, checkpoint, tmp_path / "plain", off)
    assert auto["loss"] == plain["loss"] and auto["grad_norms"] == plain["grad_norms"]
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            weights(tmp_path / "auto").values(), weights(tmp_path / "plain").values(), strict=True
        )
    )
    assert (auto["config"]["trust_region"], auto["config"]["kl_guard"]) == (None, "off")
    corrected = train_round(stale, 1, checkpoint, tmp_path / "corrected", default)
    assert (corrected["config"]["trust_region"], corrected["config"]["kl_guard"]) == (0.3, "skip")
    # the rows' made-up sampler log-probs are far over kl_guard_ceiling: the guard drops the round
    assert corrected["kl_guard_skipped"] == 1


def test_the_guard_reads_the_earlier_rounds_kls(tmp_path):
    """Version v's metrics hold round v-1's KL; under stale_rounds only stale rounds count (a fresh
    round's KL is numerical noise), and a version without metrics is passed over."""
    from rao_core.train.stage import earlier_kls

    ckpts = tmp_path / "checkpoints"
    for v, kl, stale in ((1, 1e-12, False), (2, 4e-4, True), (4, 9e-4, True)):
        (ckpts / f"version={v}").mkdir(parents=True)
        (ckpts / f"version={v}" / METRICS).write_text(json.dumps({"mismatch_kl": kl, "stale_trees": stale}))
    out = ckpts / "version=5"
    assert earlier_kls(out, 4, stale_only=True) == [4e-4, 9e-4]
    assert earlier_kls(out, 4, stale_only=False) == [1e-12, 4e-4, 9e-4]
    assert earlier_kls(out, 2, stale_only=True) == [4e-4]  # rounds 0 and 1 only
