"""Pure helpers over a rendered transcript, shared by the environment and the scripted expert.

They use only `re` and `json`, so the expert sends this module's source to the sandboxed REPL as
its first cell (what a model would write by hand: a line parser and a tally), and the environment
computes a sub-agent's reference answer with the very same code. An event is a list
[kind, session, day, actor, what, value]: kind roll (what = skill, value = die face), spell (what =
spell), travel (what = place, actor "").
"""

import json
import re

# One regex per way an event is rendered (transcript.py); anything else is chatter.
PATTERNS = [
    ("session", r"=== Session (?P<v>\d+) ==="),
    ("day", r"\[Day (?P<v>\d+), \d\d:00\]"),
    ("roll", r"(?P<a>[A-Z]\w+): \(rolls d20 for (?P<w>\w+)\) (?P<v>\d+)"),
    ("roll", r"(?P<a>[A-Z]\w+): (?P<w>\w+) check\.\.\. that's a (?P<v>\d+)\."),
    ("roll", r"(?P<a>[A-Z]\w+): Natural (?P<v>20|1) on (?P<w>\w+)(!|\. Ugh\.)"),
    ("roll", r"DM: (?P<a>[A-Z]\w+), your (?P<w>\w+) roll comes up (?P<v>\d+)\."),
    ("spell", r"(?P<a>[A-Z]\w+): I cast (?P<w>[A-Z][\w ]+)\."),
    ("spell", r"(?P<a>[A-Z]\w+): Casting (?P<w>[A-Z][\w ]+?) on the \w+!"),
    ("spell", r"DM: (?P<a>[A-Z]\w+) casts (?P<w>[A-Z][\w ]+)\."),
    ("travel", r"DM: You arrive at (?P<w>[A-Z][\w ]+)\."),
    ("travel", r"DM: The party reaches (?P<w>[A-Z][\w ]+)\."),
    ("travel", r"DM: After hours on the road, you come to (?P<w>[A-Z][\w ]+)\."),
]

# Sub-tasks a parent delegates for each question kind, and the JSON each child finishes with.
SUB_OF = {
    "nat20": "nat20", "rolls": "rolls", "casts": "casts", "top_spell": "spell_counts",
    "top_nat20": "nat20_counts", "places": "places", "spells_by": "spells_of",
    "first_spell": "spell_timeline", "arrival_day": "arrivals",
}  # fmt: skip
SUBGOALS = {
    "nat20": ("Count the natural 20s rolled by {arg} in your context.", '{"count": <int>}'),
    "rolls": ("Count the d20 rolls made by {arg} in your context.", '{"count": <int>}'),
    "casts": ("Count how many times {arg} was cast in your context.", '{"count": <int>}'),
    "spell_counts": ("Count how many times each spell was cast in your context.", '{"<spell>": <int>}'),
    "nat20_counts": (
        "Count the natural 20s rolled by each player character in your context.",
        '{"<name>": <int>}',
    ),
    "places": ("List the places the party arrived at in your context, in order.", '["<place>"]'),
    "spells_of": ("List the spells {arg} cast in your context, in order.", '["<spell>"]'),
    "spell_timeline": (
        "List every spell cast in your context, in order, as [session, spell] pairs. "
        "Your context starts in session {session} on day {day}.",
        '[[<int>, "<spell>"]]',
    ),
    "arrivals": (
        "List every arrival of the party in your context, in order, as [day, place] pairs. "
        "Your context starts in session {session} on day {day}.",
        '[[<int>, "<place>"]]',
    ),
}


def subgoal(sub, arg="", session=0, day=0):
    """The goal text of a delegated sub-task."""
    text, fmt = SUBGOALS[sub]
    return text.format(arg=arg, session=session, day=day) + " Finish with JSON only: " + fmt


def parse_events(text, session=0, day=0):
    """Events of a transcript (or a chunk that starts in `session` on `day`), in order."""
    events, patterns = [], [(kind, re.compile(p)) for kind, p in PATTERNS]
    for line in text.splitlines():
        for kind, pattern in patterns:
            m = pattern.fullmatch(line)
            if m is None:
                continue
            if kind == "session":
                session = int(m["v"])
            elif kind == "day":
                day = int(m["v"])
            else:
                g = m.groupdict()
                value = int(g["v"]) if g.get("v") else 0
                events.append([kind, session, day, g.get("a") or "", g["w"], value])
            break
    return events


def state_at(text):
    """(session, day) in force at the end of `text`: where a chunk starting there begins."""
    s = re.findall(r"^=== Session (\d+) ===$", text, re.M)
    d = re.findall(r"^\[Day (\d+), \d\d:00\]$", text, re.M)
    return (int(s[-1]) if s else 0, int(d[-1]) if d else 0)


def chunk_size(length, target, most):
    """Size of equal chunks of about `target` characters, at most `most` of them."""
    n = max(1, min(most, -(-length // target)))
    return -(-length // n)


def split_chunks(text, size):
    """[[start, chunk], ...]: pieces of `size` characters extended to the next line break, so no
    line is cut and there are at most ceil(len(text) / size) of them."""
    out, start = [], 0
    while start < len(text):
        cut = text.find("\n", start + size - 1)
        end = len(text) if cut < 0 else cut + 1
        out.append([start, text[start:end]])
        start = end
    return out


def partial(sub, arg, events):
    """A sub-task's answer over the events of one chunk."""
    rolls = [e for e in events if e[0] == "roll"]
    spells = [e for e in events if e[0] == "spell"]
    travel = [e for e in events if e[0] == "travel"]
    if sub in ("nat20", "rolls", "casts"):
        pool = {"nat20": [e for e in rolls if e[3] == arg and e[5] == 20],
                "rolls": [e for e in rolls if e[3] == arg], "casts": [e for e in spells if e[4] == arg]}  # fmt: skip
        return {"count": len(pool[sub])}
    if sub in ("spell_counts", "nat20_counts"):
        keys = [e[4] for e in spells] if sub == "spell_counts" else [e[3] for e in rolls if e[5] == 20]
        return {k: keys.count(k) for k in sorted(set(keys))}
    if sub == "places":
        return [e[4] for e in travel]
    if sub == "spells_of":
        return [e[4] for e in spells if e[3] == arg]
    if sub == "spell_timeline":
        return [[e[1], e[4]] for e in spells]
    return [[e[2], e[4]] for e in travel]  # arrivals


def combine(kind, arg, parts):
    """The question's answer from the chunks' partial results in order (None: a failed chunk)."""
    parts = [p for p in parts if p is not None]
    if kind in ("nat20", "rolls", "casts"):
        return sum(int(p.get("count", 0)) for p in parts)
    if kind in ("top_spell", "top_nat20"):
        total = {}
        for p in parts:
            for k, n in p.items():
                total[k] = total.get(k, 0) + int(n)
        ranked = sorted(total.items(), key=lambda kv: -kv[1])
        unique = ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1])
        return ranked[0][0] if unique else None
    items = [x for p in parts for x in p]
    if kind in ("places", "spells_by"):
        return list(dict.fromkeys(items))
    if kind == "first_spell":
        return next((w for s, w in items if s == int(arg)), None)
    return next((d for d, w in items if w == arg), None)  # arrival_day


def loads(text):
    """A child's JSON result, or None when it failed or answered something else."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def boxed(answer):
    """The root's finish message: lists comma-separated, unknown when no answer was found."""
    if answer is None:
        return "\\boxed{unknown}"
    return "\\boxed{" + (", ".join(answer) if isinstance(answer, list) else str(answer)) + "}"
