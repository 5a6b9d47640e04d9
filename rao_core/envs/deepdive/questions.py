"""Multi-hop questions from random walks on the graph, and the resolver that reads a hop phrase back.

A question starts at an entity named only by a blurred description (attributes, never the name:
"the architect born in the 1960s who received the Orrin Medal"), unique among all entities of its
kind, ghosts included; it then follows 1..4 relations, phrased as nested noun phrases ("the founder
of the organisation that employs ..."). Hops 1, 2, 3, 4 are the difficulties easy, medium, hard,
extreme, so the rollout and evaluation stages select them unchanged. Relations are functional and
walks never revisit an entity, so every question has exactly one answer: the last entity's name.

The train/validation split is by start entity: a validation question never starts where a
training question does.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rao_core.envs.args import DeepDiveArgs
from rao_core.envs.deepdive.graph import RELATIONS, Entity, Graph

HOPS = {"easy": 1, "medium": 2, "hard": 3, "extreme": 4}
COLUMNS = (
    "task_id",
    "question",
    "answer",
    "difficulty",
    "hops",
    "split",
    "path",
    "relations",
    "description",
    "source",
)


@dataclass
class Task:
    task_id: str
    question: str
    answer: str
    difficulty: str
    hops: int
    split: str
    path: list[str] = field(default_factory=list)  # entity ids, start first ([] for real data)
    relations: list[str] = field(default_factory=list)
    description: str = ""  # the blurred start entity
    source: str = "synthetic"  # or "real" (zai-org/DeepDive rows: no graph behind them)


def _sig(n: int) -> int:
    """n rounded to two significant figures ("about 47,000")."""
    return round(n, -max(0, len(str(n)) - 2))


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


Clause = tuple[str, Callable[[Entity], bool]]


def _clauses(e: Entity) -> tuple[Clause, Clause, Clause, Clause | None]:
    """(core, blurred date, exact date, extra) clauses of e's description, each with its test."""
    a = e.attrs

    def same(key: str, f=lambda v: v) -> Callable[[Entity], bool]:
        return lambda x: x.attrs.get(key) is not None and f(x.attrs[key]) == f(a[key])

    decade = lambda y: y // 10 * 10  # noqa: E731
    if e.kind == "person":
        y = a["birth_year"]
        extra = (f"who received {a['award']}", same("award")) if a["award"] else None
        return (f"the {a['occupation']}", same("occupation")), (f"born in the {decade(y)}s", same("birth_year", decade)), (f"born in {y}", same("birth_year")), extra  # fmt: skip
    if e.kind == "organisation":
        y = a["founded_year"]
        return (f"the {a['industry']} company", same("industry")), (f"founded in the {decade(y)}s", same("founded_year", decade)), (f"founded in {y}", same("founded_year")), (f"with about {_sig(a['employees']):,} employees", same("employees", _sig))  # fmt: skip
    if e.kind == "place":
        y, century = a["founded_year"], lambda v: v // 100 + 1
        return (f"the {a['place_kind']}", same("place_kind")), (f"founded in the {_ordinal(century(y))} century", same("founded_year", century)), (f"founded in {y}", same("founded_year")), (f"with a population of about {_sig(a['population']):,}", same("population", _sig))  # fmt: skip
    y = a["year"]
    core = (f"the {a['genre']} {a['work_kind']}", lambda x: same("genre")(x) and same("work_kind")(x))
    return core, (f"from the {decade(y)}s", same("year", decade)), (f"from {y}", same("year")), None


def describe(g: Graph, e: Entity) -> str | None:
    """The most blurred description that only `e` fits among its kind (ghosts included), or None."""
    core, blurred, exact, extra = _clauses(e)
    rivals = [x for x in g.of_kind(e.kind, ghosts=True) if x.id != e.id]
    options = [[core, blurred], [core, blurred, extra], [core, exact], [core, exact, extra]]
    for clauses in options:
        if None in clauses:
            continue
        if not any(all(test(x) for _, test in clauses) for x in rivals):
            return " ".join(text for text, _ in clauses)
    return None


def phrase(subject: str, relations: list[str]) -> str:
    for rel in relations:
        subject = RELATIONS[rel].phrase.format(x=subject)
    return subject


def question_text(description: str, relations: list[str]) -> str:
    return f"What is the name of {phrase(description, relations)}? Answer with the name only."


def split_starts(starts: list[str], cfg: DeepDiveArgs) -> dict[str, str]:
    order = sorted(starts)
    random.Random(f"deepdive-split:{cfg.seed}").shuffle(order)
    n_val = max(1, round(cfg.val_fraction * len(order)))
    return {eid: "val" if i < n_val else "train" for i, eid in enumerate(order)}


def make_tasks(g: Graph, cfg: DeepDiveArgs) -> list[Task]:
    """cfg.questions_per_difficulty distinct walks per hop count (fewer only if the graph runs out)."""
    rng = random.Random(f"deepdive-questions:{cfg.seed}")
    starts = {e.id: d for e in g.entities.values() if e.ghost_of is None and (d := describe(g, e))}
    start_ids = sorted(starts, key=lambda s: (s.split("-")[0], int(s.split("-")[1])))
    split = split_starts(start_ids, cfg)
    tasks = []
    for difficulty, hops in HOPS.items():
        seen: set[tuple] = set()
        for _ in range(cfg.questions_per_difficulty * 50):
            if len(seen) == cfg.questions_per_difficulty:
                break
            path, rels = [rng.choice(start_ids)], []
            for _ in range(hops):
                options = [r for r, dst in sorted(g[path[-1]].links.items()) if dst not in path]
                if not options:
                    break
                rels.append(rng.choice(options))
                path.append(g[path[-1]].links[rels[-1]])
            if len(rels) < hops or (path[0], tuple(rels)) in seen:
                continue
            seen.add((path[0], tuple(rels)))
            desc = starts[path[0]]
            tasks.append(
                Task(
                    f"dd-{hops}h-{len(seen) - 1}",
                    question_text(desc, rels),
                    g[path[-1]].name,
                    difficulty,
                    hops,
                    split[path[0]],
                    path,
                    rels,
                    desc,
                )  # fmt: skip
            )
    return tasks


# --- reading a goal back --------------------------------------------------------------------------
_LEAD = re.compile(r"^(?:what is the name of|find the name of|what is|who is|find out|find|identify|name)\s+")
_TEMPLATES = [
    (rel, re.compile("^" + re.escape(r.phrase.lower()).replace(re.escape("{x}"), "(.+)") + "$"))
    for rel, r in RELATIONS.items()
]


def _norm(text: str) -> str:
    return " ".join(text.lower().replace('"', " ").replace("'", " ").split())


def goal_phrase(goal: str) -> str:
    """The noun phrase a goal asks for: its first sentence without a leading "Find"/"What is the
    name of" and without the final punctuation."""
    first = re.split(r"\?|\.\s|\.$|\n", goal.strip(), maxsplit=1)[0]
    return _LEAD.sub("", _norm(first)).strip(" .")


@dataclass
class Chain:
    start: str  # entity id
    relations: list[str]
    description: str | None  # the start was named by this description, not by its name


class Resolver:
    """Reads a hop phrase ("the founder of Kelvar Press", nested at any depth, or starting from a
    known description) back into (start, relations), so a sub-agent's goal gets a reference answer."""

    def __init__(self, g: Graph, descriptions: dict[str, str] | None = None) -> None:
        self.g = g
        self.descriptions = {_norm(d): eid for d, eid in (descriptions or {}).items()}

    def chain(self, text: str) -> Chain | None:
        text = _norm(text)
        if text in self.descriptions:
            return Chain(self.descriptions[text], [], text)
        if text in self.g.by_name:
            return Chain(self.g.by_name[text], [], None)
        for rel, pattern in _TEMPLATES:
            m = pattern.match(text)
            inner = self.chain(m.group(1)) if m else None
            if inner and self.g.walk(inner.start, inner.relations + [rel]) is not None:
                return Chain(inner.start, inner.relations + [rel], inner.description)
        return None

    def of_goal(self, goal: str) -> Chain | None:
        return self.chain(goal_phrase(goal))

    def answer(self, chain: Chain) -> str:
        return self.g[self.g.walk(chain.start, chain.relations)].name


def write_tasks(tasks: list[Task], path: str | Path) -> None:
    rows = {k: [getattr(t, k) for t in tasks] for k in COLUMNS}
    rows["path"] = [json.dumps(t.path) for t in tasks]
    rows["relations"] = [json.dumps(t.relations) for t in tasks]
    pq.write_table(pa.table(rows), path)


def load_tasks(path: str | Path) -> list[Task]:
    rows = pq.read_table(path, columns=list(COLUMNS)).to_pylist()
    return [
        Task(**{**r, "path": json.loads(r["path"]), "relations": json.loads(r["relations"])}) for r in rows
    ]
