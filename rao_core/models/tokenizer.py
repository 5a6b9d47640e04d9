"""The bootstrap tokenizer: a byte-level BPE trained locally, with every digit its own token.

No tokenizer can be downloaded here, so the embedded default trains one in about two seconds on a
corpus of agent-style text, once: the result is cached (cache_dir(), keyed by a hash of its
inputs and code). Splitting digits keeps item names like `m2_i3_7` and counts copyable token by
token. The chat template is ChatML, the format of the Qwen family.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import random
import string
from collections.abc import Iterable
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "craft get_info view_inventory finish launch_subagent await asyncio gather print for in if else "
    "return results result info items item inventory recipe ingredients output targets target count "
    "thought python Error: Crafted Inventory now has not enough need have sub-agent Sub-agent did "
    "finished failed budget depth steps Craft the You are a recursive agent Write one cell cell "
    "Observation Refused limit reached Do this work yourself True False None is_base in_inventory "
    "crafting_depth can_craft error unknown amount must be multiple of wrong expected"
).split()


def default_corpus(n_lines: int = 4000, seed: int = 0) -> Iterable[str]:
    """Synthetic agent text: tags, tool calls with item names and counts, prose words."""
    rng = random.Random(seed)

    def name() -> str:
        d = rng.choice("mx")
        return f"{d}{rng.randint(0, 4)}_i{rng.randint(0, 12)}_{rng.randint(0, 30)}"

    for _ in range(n_lines):
        a, b, c = name(), name(), name()
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        yield (
            f"<thought>{words}</thought>\n<python>\ninfo = get_info(['{a}', '{b}'])\nprint(info)\n"
            f"print(craft({{'{a}': {rng.randint(1, 9)}, '{b}': {rng.randint(1, 4)}}}, ('{c}', {rng.randint(1, 4)})))\n"
            f"results = await asyncio.gather(launch_subagent({{'{a}': 2}}), launch_subagent({{'{b}': 1}}))\n"
            f"finish('Crafted {rng.randint(1, 4)} {c}')\n</python>"
        )
        yield f"[{{'item': '{a}', 'is_base': False, 'recipe': {{'ingredients': {{'{b}': 2}}, 'output': 1}}}}]"
        s, t, u = (f"{rng.choice(string.ascii_lowercase)}{rng.randint(1, 99)}" for _ in range(3))
        yield (
            f"Goal: make {s}\n<python>\ninfo('{s}')\n</python>\n{s} <- {t}, {u}; have 0; missing {t}\n"
            f"<python>\nsub('{t}')\n</python>\ndone\n<python>\ncraft('{s}')\n</python>\ncrafted {s}; have 1\n"
            f"<python>\nfinish('done')\n</python>\n{u} is raw; have 2\nunknown item {s}\nError: missing {u}"
        )


def train_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = 512,
    special_tokens: list[str] = SPECIAL_TOKENS,
    eos: str = "<|im_end|>",
    pad: str = "<|endoftext|>",
    bos: str | None = None,
    chat_template: str = CHATML_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE on `corpus` with these special tokens and chat template (the defaults are
    the bootstrap tokenizer's; tests build other model families' framings the same way).

    Training takes about 2 s, which every process that frames the tiny model's chats would pay
    (each `rao` command checks its config with it), so the trained BPE is kept in the cache folder
    (cache_dir()) under a hash of everything it depends on and read from there (about 0.2 s,
    most of it making the corpus to hash)."""
    corpus = list(corpus)
    path = cache_dir() / "tokenizers" / f"bpe-{_bpe_key(corpus, vocab_size, special_tokens)}.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception:  # not cached yet (or unreadable): train it, and cache it where we can
        tok = _train_bpe(corpus, vocab_size, special_tokens)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(tok.to_str())
            os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=pad, bos_token=bos, unk_token=None
    )
    fast.chat_template = chat_template
    return fast


def cache_dir() -> Path:
    """Where rao keeps what it can rebuild: $RAO_CACHE_DIR, else $XDG_CACHE_HOME/rao, else
    ~/.cache/rao."""
    if os.environ.get("RAO_CACHE_DIR"):
        return Path(os.environ["RAO_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rao"


def _bpe_key(corpus: list[str], vocab_size: int, special_tokens: list[str]) -> str:
    """A hash of the BPE's inputs, the code that trains it and the tokenizers version."""
    digest = hashlib.sha256()
    for part in (tokenizers.__version__, inspect.getsource(_train_bpe), str(vocab_size), *special_tokens):
        digest.update(part.encode() + b"\0")
    for text in corpus:
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:16]


def _train_bpe(corpus: list[str], vocab_size: int, special_tokens: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # Spaces are tokens of their own, so a name is the same tokens after a space, a quote or a
    # bracket: `make b92` and `info('b92')` both spell b, 9, 2. A tiny model must copy names from its
    # goal and from tool output into its actions, and cannot learn to map ' b' onto 'b'.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(" ", behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


@functools.lru_cache(maxsize=4)
def tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """The embedded default; deterministic for a given vocab size."""
    return train_tokenizer(default_corpus(), vocab_size=vocab_size)


def load_tokenizer(name: str | Path) -> PreTrainedTokenizerBase:
    """'tiny' (trained here), a shipped checkpoint, a local folder or a hub id (downloaded on first
    use); it must have a chat template, which frames every node's conversation."""
    if str(name) == "tiny":
        return tiny_tokenizer()
    from transformers import AutoTokenizer  # 3-4 s of imports: not for the tiny one (`--check`)

    from rao_core.models.locate import local_model

    tok = AutoTokenizer.from_pretrained(str(local_model(str(name))), local_files_only=True)
    if tok.chat_template is None:
        raise ValueError(f"tokenizer {str(name)!r} has no chat template")
    return tok
