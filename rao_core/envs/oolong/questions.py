"""Questions over a transcript, answered exactly from its event log, and the sub-task templates.

Four families, as in Oolong: counting (nat20, rolls, casts), distribution (top_spell, top_nat20),
enumeration (places, spells_by) and temporal order (first_spell, arrival_day). A question is only
asked when its answer is well defined (a unique most frequent spell, a session with a spell...).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from rao_core.envs.oolong.extract import SUB_OF, SUBGOALS, combine, partial, subgoal
from rao_core.envs.oolong.transcript import Transcript

QUESTIONS = {
    "nat20": "How many times did {arg} roll a natural 20?",
    "rolls": "How many d20 rolls did {arg} make?",
    "casts": "How many times was the spell {arg} cast?",
    "top_spell": "Which spell was cast most often?",
    "top_nat20": "Which player character rolled the most natural 20s?",
    "places": "List the distinct places the party arrived at, in order of first arrival.",
    "spells_by": "List the distinct spells {arg} cast, in order of first casting.",
    "first_spell": "What was the first spell cast in session {arg}?",
    "arrival_day": "On which in-game day did the party first arrive at {arg}?",
}
KINDS = list(QUESTIONS)
FAMILY = {
    "nat20": "counting", "rolls": "counting", "casts": "counting", "top_spell": "distribution",
    "top_nat20": "distribution", "places": "enumeration", "spells_by": "enumeration",
    "first_spell": "temporal", "arrival_day": "temporal",
}  # fmt: skip


@dataclass
class Question:
    kind: str
    arg: str
    text: str
    answer: Any  # int, str or list[str]


def answer_from_log(kind: str, arg: str, transcript: Transcript) -> Any:
    """The exact answer over the whole log (one 'chunk' holding every event)."""
    events = [e.as_list() for e in transcript.events]
    return combine(kind, arg, [partial(SUB_OF[kind], arg, events)])


def candidate_args(kind: str, tr: Transcript) -> list[str]:
    """Candidate arguments of a question kind in this transcript ('' when it takes none)."""
    if kind in ("nat20", "rolls"):
        return sorted(tr.characters)
    if kind == "casts":
        return sorted({e.what for e in tr.events if e.kind == "spell"})
    if kind == "spells_by":
        return sorted({e.actor for e in tr.events if e.kind == "spell"})
    if kind == "first_spell":
        return sorted({str(e.session) for e in tr.events if e.kind == "spell"}, key=int)
    if kind == "arrival_day":
        return sorted({e.what for e in tr.events if e.kind == "travel"})
    return [""]


def make_question(rng: random.Random, tr: Transcript, prefer: str) -> Question:
    """A well-defined question, of kind `prefer` when this transcript allows one, else the next kind."""
    start = KINDS.index(prefer)
    for kind in KINDS[start:] + KINDS[:start]:
        args = candidate_args(kind, tr)
        rng.shuffle(args)
        for arg in args:
            answer = answer_from_log(kind, arg, tr)
            if answer is not None and answer != []:
                return Question(kind, arg, QUESTIONS[kind].format(arg=arg), answer)
    raise ValueError("transcript too short for any question")  # a few hundred characters at least


def _template_regex(sub: str) -> re.Pattern:
    text = re.escape(subgoal(sub, "\0arg\0", "\0session\0", "\0day\0"))
    for name, group in (("arg", r"(?P<arg>.+?)"), ("session", r"(?P<session>\d+)"), ("day", r"(?P<day>\d+)")):
        text = text.replace(re.escape(f"\0{name}\0"), group)
    return re.compile(text)


_SUBGOAL_RE = {sub: _template_regex(sub) for sub in SUBGOALS}


def match_subgoal(goal: str) -> tuple[str, str, int, int] | None:
    """(sub, arg, session, day) when a goal is one of the known sub-task templates, else None."""
    goal = " ".join(goal.split())
    for sub, pattern in _SUBGOAL_RE.items():
        if m := pattern.fullmatch(goal):
            g = m.groupdict()
            return sub, g.get("arg") or "", int(g.get("session") or 0), int(g.get("day") or 0)
    return None
