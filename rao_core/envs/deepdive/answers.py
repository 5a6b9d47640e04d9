"""How answers are compared. Root scoring is exact match after normalisation:

1. the answer is the content of the last `\\boxed{...}` if there is one, else the text after the last
   "Answer:" if there is one, else the whole finish message;
2. both sides are normalised SQuAD-style: lowercase, punctuation removed, the articles a/an/the
   removed, whitespace collapsed;
3. the two normalised strings must be equal.

So "Kelvar Press", "kelvar press." and "Answer: Kelvar Press" match "Kelvar Press"; "It is Kelvar
Press" does not (the root question asks for the name only). Sub-agents answer in free text, so their
fallback check (when no judge is wired) is containment of the normalised reference as whole words.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER = re.compile(r"answer\s*:\s*", re.I)
_PUNCT = re.compile(r"[^\w\s]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def extract_answer(message: str) -> str:
    boxed = _BOXED.findall(message)
    if boxed:
        return boxed[-1]
    parts = _ANSWER.split(message)
    return parts[-1] if len(parts) > 1 else message


def normalize(text: str) -> str:
    text = _PUNCT.sub(" ", text.lower())
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(message: str, gold: str) -> bool:
    return normalize(extract_answer(message)) == normalize(gold) != ""


def mentions(message: str, gold: str) -> bool:
    """The normalised gold answer occurs in the normalised message as whole words."""
    gold_n = normalize(gold)
    return bool(gold_n) and f" {gold_n} " in f" {normalize(message)} "
