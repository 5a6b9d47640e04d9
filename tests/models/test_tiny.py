"""The bootstrap model: a config vLLM can load, seeded builds, atomic checkpoints, 'tiny' caching; the
shipped checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from rao_core.models.locate import SHIPPED, is_shipped, local_model
from rao_core.models.tiny import (
    build_tiny_model,
    load_checkpoint,
    resolve_model,
    save_checkpoint,
    tiny_config,
)
from rao_core.models.tokenizer import tiny_tokenizer

TOK = tiny_tokenizer()
SMALL = dict(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128)


def same_weights(a, b) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_config_fits_tokenizer_and_vllm():
    cfg = tiny_config(TOK)
    assert cfg.vocab_size == len(TOK) and cfg.tie_word_embeddings
    assert cfg.head_dim >= 32 and cfg.num_attention_heads % cfg.num_key_value_heads == 0
    assert cfg.eos_token_id == TOK.eos_token_id and cfg.pad_token_id == TOK.pad_token_id
    assert tiny_config(TOK, hidden=64, heads=4).head_dim == 32  # raised to vLLM's minimum


def test_build_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_model(TOK, seed=0, **SMALL)
    assert torch.equal(torch.rand(1), expected)
    assert same_weights(a, build_tiny_model(TOK, seed=0, **SMALL))
    assert not same_weights(a, build_tiny_model(TOK, seed=1, **SMALL))
    assert a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr()  # tied


def test_checkpoint_round_trip_and_atomic_overwrite(tmp_path):
    path = tmp_path / "ckpt"
    first = build_tiny_model(TOK, seed=0, **SMALL)
    save_checkpoint(first, TOK, path)
    second = build_tiny_model(TOK, seed=1, **SMALL)
    save_checkpoint(second, TOK, path)  # replaces the folder whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folders left
    model, tok = load_checkpoint(path, "cpu", "float32")
    assert same_weights(model, second) and not model.training
    assert tok.chat_template == TOK.chat_template and tok.encode("craft m0_i1_2") == TOK.encode(
        "craft m0_i1_2"
    )
    half, _ = load_checkpoint(path, "cpu", "bfloat16")
    assert half.dtype == torch.bfloat16


def test_resolve_model_caches_tiny(tmp_path):
    path = resolve_model("tiny", tmp_path)
    assert path.parent == tmp_path and path.name.startswith("tiny-")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny", tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # built once
    model, _ = load_checkpoint(path, "cpu")
    assert same_weights(model, build_tiny_model(TOK, seed=0))
    assert resolve_model(str(path)) == path
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "missing"))


@pytest.mark.parametrize("name", sorted(p.name for p in SHIPPED.iterdir() if p.is_dir()))
def test_shipped_checkpoints_load_by_name_with_their_recipe(name):
    """Every shipped checkpoint is a `policy.model` name that loads, with the tiny tokenizer's
    vocabulary, and carries the commands that made it and its metrics (docs/small-profile.md)."""
    assert is_shipped(name) and local_model(name) == SHIPPED / name
    model, tok = load_checkpoint(SHIPPED / name, device="cpu")
    assert tok.get_vocab() == TOK.get_vocab() and model.config.vocab_size == len(TOK)
    recipe = (SHIPPED / name / "COMMAND").read_text()
    assert recipe.startswith(("rao warmstart", "rao train", ".venv/bin/python"))
    assert json.loads((SHIPPED / name / "metrics.json").read_text())["train"]["steps"] > 0


def test_the_trained_bpe_is_cached_and_read_back_the_same(tmp_path, monkeypatch):
    """The BPE is trained once into the cache folder; later processes read it back: the same
    tokenizer, token for token. A damaged cache file is trained again and replaced."""
    from rao_core.models.tokenizer import cache_dir, default_corpus, train_tokenizer

    monkeypatch.setenv("RAO_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache"
    trained = train_tokenizer(default_corpus(500), 300)
    [path] = (tmp_path / "cache" / "tokenizers").iterdir()
    read = train_tokenizer(default_corpus(500), 300)
    text = "<|im_start|>user\ncraft('m2_i3_7', 12) and info('b92')<|im_end|>"
    assert read.backend_tokenizer.to_str() == trained.backend_tokenizer.to_str()
    assert read(text)["input_ids"] == trained(text)["input_ids"] and len(read) == len(trained)
    assert (read.eos_token_id, read.pad_token_id, read.chat_template) == (
        trained.eos_token_id, trained.pad_token_id, trained.chat_template
    )  # fmt: skip
    other = train_tokenizer(default_corpus(500), 301)  # other inputs: a file of their own
    assert len(list(path.parent.iterdir())) == 2 and len(other) != len(trained)
    path.write_text("{not json")  # damaged: trained again, and replaced by a whole file
    assert (
        train_tokenizer(default_corpus(500), 300).backend_tokenizer.to_str()
        == trained.backend_tokenizer.to_str()
    )
    stamp = path.stat().st_mtime_ns
    assert train_tokenizer(default_corpus(500), 300)(text)["input_ids"] == trained(text)["input_ids"]
    assert path.stat().st_mtime_ns == stamp  # read back, not written again
    assert not list(path.parent.glob("*.tmp-*"))
