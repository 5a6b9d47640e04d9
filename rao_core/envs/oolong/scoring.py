"""The official Oolong scoring rule for root answers, and a checker for sub-agents' partial results.

Root (docs/suites.md): the last `\\boxed{...}` of the finish message is the answer. Against an
integer gold it scores 0.75 ** |gold - pred|; against a string, 1 if equal after normalisation
(case, whitespace, surrounding quotes and a final period), else 0; against a list, the answer is
split on commas and scores |pred & gold| / |gold| over distinct normalised items (recall, as in
the spec: extra items cost nothing). No box, or no integer where one is due: 0.
"""

from __future__ import annotations

import json
import re
from typing import Any


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, braces balanced; None when there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def normalize(text: Any) -> str:
    text = " ".join(str(text).split()).casefold()
    return text.strip("\"'`").rstrip(".").strip()


def parse_int(text: str) -> int | None:
    t = text.strip().replace(",", "").replace("_", "")
    m = re.fullmatch(r"[-+]?\d+(\.0*)?", t)
    return int(float(t)) if m else None


def split_list(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [normalize(x) for x in text.split(",") if normalize(x)]


def score_answer(finish_message: str, gold: Any) -> float:
    """The official score in [0, 1] of a root's finish message."""
    pred = extract_boxed(finish_message)
    if pred is None:
        return 0.0
    if isinstance(gold, bool):
        gold = str(gold)
    if isinstance(gold, int):
        n = parse_int(pred)
        return 0.0 if n is None else 0.75 ** abs(gold - n)
    if isinstance(gold, list):
        want = {normalize(x) for x in gold}
        if not want:
            return float(not split_list(pred))
        return len(want & set(split_list(pred))) / len(want)
    return float(normalize(pred) == normalize(gold))


def _json_in(text: str) -> Any:
    """The JSON value of a message: the whole text, else its outermost {...} or [...] span."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    for a, b in ("{}", "[]"):
        i, j = text.find(a), text.rfind(b)
        if 0 <= i < j:
            try:
                return json.loads(text[i : j + 1])
            except ValueError:
                continue
    return None


def _canon(value: Any) -> Any:
    """Strings normalised, zero counts dropped, so equal content compares equal."""
    if isinstance(value, dict):
        return {normalize(k): _canon(v) for k, v in value.items() if v != 0}
    if isinstance(value, list):
        return [_canon(v) for v in value]
    return normalize(value) if isinstance(value, str) else value


def score_partial(finish_message: str, reference: Any) -> float:
    """A sub-agent's JSON result against the exact reference on its chunk: counts by the integer
    rule, tallies and lists only when equal (after normalisation)."""
    got = _json_in(finish_message)
    if isinstance(reference, dict) and set(reference) == {"count"}:
        n = got.get("count") if isinstance(got, dict) else None
        ok = isinstance(n, int) and not isinstance(n, bool)
        return 0.75 ** abs(reference["count"] - n) if ok else 0.0
    return float(got is not None and _canon(got) == _canon(reference))
