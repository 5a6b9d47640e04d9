"""The warm-start stage: expert data, the shared-prefix loss, and the stage end to end on a tiny budget."""

from __future__ import annotations

import contextlib
import json
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rao_core.agent.prompts import ChatFraming
from rao_core.envs.suites import open_suite
from rao_core.models.tiny import build_tiny_model, load_checkpoint
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.run import load_config
from rao_core.train.warmstart import (
    SharedPrefixCollator,
    SharedPrefixSFTTrainer,
    WarmStartConfig,
    copy_drill,
    expert_examples,
    warm_start,
)

TOK = tiny_tokenizer()


def small_suite(tmp_path):
    """The default suite (textcraft-small) of a run under tmp_path."""
    return open_suite(load_config(overrides=[f"runs_dir={tmp_path}"]))


TINY = dict(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, context=1024)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    cfg = WarmStartConfig(recursive_episodes=3, flat_episodes=8, error_rate=0.5, seed=3, **TINY)
    rows, trees = expert_examples(cfg, ChatFraming(TOK), small_suite(tmp_path_factory.mktemp("run")))
    assert trees["made"] == 11 and trees["kept"] + trees["dropped"] == 11 and trees["examples"] == len(rows)
    return rows


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_examples_are_nodes_with_action_only_loss(rows):
    assert {r["mode"] for r in rows} == {"recursive", "flat"}
    assert any(r["depth"] > 0 for r in rows)  # every node of a recursive tree is its own example
    masked_slips = 0
    for r in rows:
        assert len(r["input_ids"]) == len(r["assistant_masks"]) and sum(r["assistant_masks"]) > 0
        text = TOK.decode([t for t, m in zip(r["input_ids"], r["assistant_masks"], strict=True) if m])
        assert "<|im_start|>" not in text and "have " not in text  # no prompt or observation is trained
        for a, b in runs(r["assistant_masks"]):
            assert TOK.decode(r["input_ids"][a:b]).startswith("<python>\n")
        for a, b in runs(_action_runs(r)):
            if not any(r["assistant_masks"][a:b]):  # a slip: no loss on it, but its repair is trained
                after = TOK.decode(r["input_ids"][b : b + 24])
                assert "Error: missing" in after or "unknown item" in after
                masked_slips += 1
    assert masked_slips > 0


def _action_runs(r: dict) -> list[int]:
    """The node's action tokens: every `<python>...</python>` reply, slips included."""
    text_ids, mask, i = r["input_ids"], [0] * len(r["input_ids"]), 0
    header = TOK.encode("<|im_start|>assistant\n", add_special_tokens=False)
    start = TOK.encode("<python>", add_special_tokens=False)
    end = TOK.encode("</python>", add_special_tokens=False)
    while i < len(text_ids):
        if text_ids[i : i + len(start)] == start and text_ids[i - len(header) : i] == header:
            j = next(k for k in range(i, len(text_ids)) if text_ids[k : k + len(end)] == end) + len(end)
            mask[i:j] = [1] * (j - i)
            i = j
        else:
            i += 1
    return mask


def _labelled(r: dict) -> dict:
    return {
        "input_ids": r["input_ids"],
        "labels": [t if m else -100 for t, m in zip(r["input_ids"], r["assistant_masks"], strict=True)],
    }


def test_shared_prefix_loss_equals_the_plain_loss(rows):
    model = build_tiny_model(TOK, seed=0, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128)
    batch = [r for r in rows if r["mode"] == "recursive"][:4] + [r for r in rows if r["mode"] == "flat"][:2]
    examples = [
        {
            "input_ids": r["input_ids"],
            "labels": [t if m else -100 for t, m in zip(r["input_ids"], r["assistant_masks"], strict=True)],
        }
        for r in batch
    ]
    inputs = SharedPrefixCollator(TOK.pad_token_id)(examples)
    assert inputs["prefix_ids"].shape[1] > 100  # the system prompt is shared
    fake = SimpleNamespace(tokens_seen=0, accelerator=SimpleNamespace(autocast=contextlib.nullcontext))
    shared = SharedPrefixSFTTrainer.compute_loss(fake, model, inputs)
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.tensor(
        [e["input_ids"] + [TOK.pad_token_id] * (width - len(e["input_ids"])) for e in examples]
    )
    labels = torch.tensor([e["labels"] + [-100] * (width - len(e["labels"])) for e in examples])
    mask = torch.tensor([[1] * len(e["input_ids"]) + [0] * (width - len(e["input_ids"])) for e in examples])
    logits = model(input_ids=ids, attention_mask=mask).logits
    plain = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    assert torch.allclose(shared, plain, atol=1e-5), (shared, plain)
    assert fake.tokens_seen < int(mask.sum())  # and it computes fewer tokens
    mixed = SharedPrefixCollator(TOK.pad_token_id)(
        examples[:1] + [_labelled(r) for r in copy_drill(TOK, 2, 0)]
    )
    assert mixed["prefix_ids"].shape[1] == 0  # nothing shared: a plain forward
    assert torch.isfinite(SharedPrefixSFTTrainer.compute_loss(fake, model, mixed))


def test_warm_start_on_a_tiny_budget(tmp_path, capsys):
    cfg = WarmStartConfig(
        recursive_episodes=4, flat_episodes=4, max_steps=3, batch_size=4, max_minutes=2.0, drill_steps=2,
        eval_tasks=1, eval_difficulties=["easy"], **TINY,
    )  # fmt: skip
    metrics = warm_start(cfg, tmp_path, small_suite(tmp_path))
    assert metrics["train"]["steps"] == 3 and metrics["train"]["tokens_seen"] > 0
    assert metrics["train"]["drill"]["steps"] == 2
    assert set(metrics["eval"]["success"]) == {"recursive", "flat"}
    assert 0.0 <= metrics["eval"]["success"]["flat"]["easy"]["rate"] <= 1.0
    line = capsys.readouterr().out.strip().splitlines()[-1]  # the warm start in one line, last
    assert re.fullmatch(
        r"warm start: 8 demonstration trees, \d kept \(\d+ nodes to learn from\), \d dropped \(roots that "
        r"ended: [^)]*\); 3 steps in [\d.]+ min(, final loss [\d.]+)?; held-out success recursive \d+% \(n=1\), "
        r"flat \d+% \(n=1\)",
        line,
    ), line
    model, tok = load_checkpoint(tmp_path / "model", device="cpu")
    assert model.config.hidden_size == 64 and tok.get_vocab() == TOK.get_vocab()
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    stamp = (tmp_path / "metrics.json").stat().st_mtime_ns
    assert (
        warm_start(cfg, tmp_path, small_suite(tmp_path)) == metrics
    )  # complete: returned as is, nothing retrained
    assert (tmp_path / "metrics.json").stat().st_mtime_ns == stamp


def test_copy_drill_trains_only_the_copied_name():
    rows = copy_drill(TOK, 5, seed=0)
    assert rows == copy_drill(TOK, 5, seed=0) and len(rows) == 5
    for r in rows:
        text = TOK.decode(r["input_ids"])
        name = text.split("Goal: make ")[1].split("\n")[0]
        labelled = TOK.decode([t for t, m in zip(r["input_ids"], r["assistant_masks"], strict=True) if m])
        assert text.endswith(f"info('{name}')") and labelled == f"{name}')"


def test_format_table():
    from rao_core.train.warmstart_job import format_table

    cell = {"rate": 0.5, "n": 10, "lo": 0.2, "hi": 0.8}
    text = format_table({"success": {"recursive": {"easy": cell}, "flat": {"easy": cell}}})
    assert "| easy | 50% [20%, 80%] (n=10) | 50% [20%, 80%] (n=10) |" in text


def test_warm_start_fine_tunes_a_checkpoint(tmp_path):
    """init_model: the shipped weights are the start (no drill); a tiny lr moves them a little."""
    from rao_core.models.locate import SHIPPED

    cfg = WarmStartConfig(
        init_model="small-warmstart", recursive_episodes=3, flat_episodes=0, root_inline_rate=1.0, max_steps=2,
        batch_size=2, lr=1e-6, max_minutes=2.0, eval_tasks=0, context=2048,
    )  # fmt: skip
    metrics = warm_start(cfg, tmp_path, small_suite(tmp_path))
    assert "drill" not in metrics["train"] and metrics["train"]["steps"] == 2
    assert metrics["data"]["by_mode"] == {"recursive": 3, "flat": 0}  # inline roots: one node a tree
    start, _ = load_checkpoint(SHIPPED / "small-warmstart", device="cpu")
    tuned, _ = load_checkpoint(tmp_path / "model", device="cpu")
    gaps = [(a - b).abs().max().item() for a, b in zip(start.parameters(), tuned.parameters(), strict=True)]
    assert 0 < max(gaps) < 1e-3  # moved, from the shipped weights (a fresh init is far off)


def test_expert_replies_longer_than_max_new_tokens_are_reported():
    from types import SimpleNamespace

    from rao_core.train.demonstrations import reply_lengths, warn_long_replies

    assert reply_lengths([0, 1, 1, 0, 0, 1, 1, 1, 0, 1]) == [2, 3, 1]
    records = [
        SimpleNamespace(action_mask=[0, 1, 1, 0, 1, 1, 1]),
        SimpleNamespace(action_mask=[0] * 3 + [1] * 5),
    ]
    assert warn_long_replies(records, 5) is None
    line = warn_long_replies(records, 2)
    assert line.startswith("warm start: 2 of 3 expert replies are longer than agent.max_new_tokens=2")
    assert "the longest: 5 tokens" in line and "at least 5" in line
