"""The warm start works for any suite and any tokenizer: a pretrained checkpoint with its own chat
template, demonstrations from a Parquet of trees, and a clear error for a suite with neither."""

from __future__ import annotations

import json

import pytest

from rao_core.config import WarmStartConfig
from rao_core.envs.suites import open_suite
from rao_core.models.tiny import load_checkpoint
from rao_core.models.tokenizer import load_tokenizer
from rao_core.run import Run, load_config
from rao_core.stages.rollout import roll_out
from tests.agent.families import FAMILIES, checkpoint

TINY = dict(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, context=2048)
SHORT = dict(max_steps=2, batch_size=2, max_minutes=2.0, drill_steps=0)


def actions(row: dict, tok) -> list[str]:
    """The trained (masked-in) runs of tokens of one SFT example, decoded."""
    out, run = [], []
    for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True):
        if m:
            run.append(t)
        elif run:
            out.append(tok.decode(run))
            run = []
    return out + ([tok.decode(run)] if run else [])


def test_a_pretrained_checkpoint_learns_in_its_own_chat_template(tmp_path):
    """A bf16 Llama-3-style checkpoint: the expert's trees are framed by its template, trained on
    its actions only, and the tuned model is evaluated through the same framing."""
    family = FAMILIES["llama3"]
    ckpt = checkpoint(family, tmp_path / "llama3")
    run = load_config(overrides=[f"runs_dir={tmp_path}", f"policy.model={ckpt}"])
    ws = WarmStartConfig(init_model=str(ckpt), recursive_episodes=2, flat_episodes=2, eval_tasks=1,
                         eval_difficulties=["easy"], **SHORT)  # fmt: skip
    from rao_core.train.warmstart import warm_start

    metrics = warm_start(ws, tmp_path / "ws", open_suite(run))
    tok = load_tokenizer(str(ckpt))
    rows = [json.loads(line) for line in (tmp_path / "ws" / "sft.jsonl").read_text().splitlines()]
    assert (
        rows and metrics["train"]["steps"] == 2 and set(metrics["eval"]["success"]) == {"recursive", "flat"}
    )
    for row in rows:
        text = tok.decode(row["input_ids"])
        assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
        for action in actions(row, tok):
            assert action.startswith("<python>") and action.endswith("</python>"), (
                action
            )  # stop string ends a turn
    model, tuned_tok = load_checkpoint(tmp_path / "ws" / "model", device="cpu")
    assert tuned_tok.get_vocab() == tok.get_vocab() and model.config.vocab_size == len(tok)


def test_demonstrations_from_a_parquet_of_trees(tmp_path):
    """A scripted rollout's partition (the nodes schema) is the SFT data; no expert is asked."""
    run = load_config(overrides=[f"runs_dir={tmp_path}", "policy.kind=scripted", "rollout.num_tasks=2",
                                 "rollout.group_size=2", "rollout.difficulty=easy"])  # fmt: skip
    trees = roll_out(Run(run), 0)
    ws = WarmStartConfig(demonstrations=str(trees), eval_tasks=0, **TINY, **SHORT)
    from rao_core.train.warmstart import warm_start

    metrics = warm_start(ws, tmp_path / "ws", open_suite(run))
    assert metrics["data"]["examples"] > 0 and metrics["train"]["steps"] == 2
    assert metrics["data"]["trees"] == {"examples": metrics["data"]["examples"]}  # no trees of ours
    bad = WarmStartConfig(demonstrations=str(tmp_path / "nope"), eval_tasks=0, **TINY, **SHORT)
    with pytest.raises(ValueError, match="warmstart.demonstrations: .*no such file or folder"):
        warm_start(bad, tmp_path / "ws2", open_suite(run))


def test_a_suite_without_an_expert_says_what_to_give(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([{"id": "a", "goal": "say a", "answer": "a"}]), tmp_path / "q.parquet"
    )
    run = load_config(overrides=[f"runs_dir={tmp_path}", "suite=dataset", f"suite_args.path={tmp_path / 'q.parquet'}",
                                 "judge.kind=scripted"])  # fmt: skip
    from rao_core.train.warmstart import warm_start

    with pytest.raises(ValueError, match="warmstart.demonstrations: suite dataset has no scripted expert"):
        warm_start(WarmStartConfig(eval_tasks=0, **TINY, **SHORT), tmp_path / "ws", open_suite(run))
