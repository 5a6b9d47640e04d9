"""A seeded synthetic knowledge graph: people, organisations, places and works with attributes and
typed, functional relations (each entity has at most one target per relation), so every walk along
relations has exactly one answer.

Names are made of meaningless syllables (like TextCraft's item names) so a model cannot answer from
priors and has to search. Near-namesake "ghost" entities (same kind, a similar name, overlapping
attributes) exist only as distractor pages: no relation points at them and no question starts at
them, but descriptions are made unique against them too.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from rao_core.envs.args import DeepDiveArgs

KINDS = ("person", "organisation", "place", "work")


@dataclass(frozen=True)
class Relation:
    src: str  # kind of the subject
    dst: str  # kind of the object
    phrase: str  # noun phrase of the object, "{x}" = the subject: questions and goals use it
    keyword: str  # words a page uses for the fact (the expert's search term)


RELATIONS: dict[str, Relation] = {
    "born_in": Relation("person", "place", "the place where {x} was born", "born in"),
    "works_for": Relation("person", "organisation", "the organisation that employs {x}", "works for"),
    "debut_work": Relation("person", "work", "the debut work of {x}", "debut work"),
    "headquartered_in": Relation(
        "organisation", "place", "the place where {x} is headquartered", "headquartered in"
    ),
    "founded_by": Relation("organisation", "person", "the founder of {x}", "founded by"),
    "mayor": Relation("place", "person", "the mayor of {x}", "mayor"),
    "twinned_with": Relation("place", "place", "the twin town of {x}", "twinned with"),
    "created_by": Relation("work", "person", "the creator of {x}", "created by"),
    "published_by": Relation("work", "organisation", "the organisation that released {x}", "released by"),
    "set_in": Relation("work", "place", "the place where {x} is set", "set in"),
}

OCCUPATIONS = (
    "architect botanist cartographer chemist composer economist engineer historian journalist "
    "linguist novelist painter physician sculptor photographer astronomer"
).split()
AWARDS = [
    f"the {w} {p}" for w in ("Halvard", "Orrin", "Selka", "Venmoor", "Tarquel") for p in ("Medal", "Prize")
]
INDUSTRIES = {  # industry -> name suffix
    "publishing": "Press",
    "film": "Pictures",
    "music": "Records",
    "theatre": "Playhouse",
    "software": "Systems",
    "banking": "Bank",
    "shipping": "Lines",
    "brewing": "Brewery",
}
PLACE_KINDS = ("port city", "river town", "mountain town", "island town", "market town", "university city")
WORK_KINDS = {"novel": "publishing", "film": "film", "album": "music", "play": "theatre"}
GENRES = ("mystery", "comedy", "tragedy", "science fiction", "romance", "historical", "satirical", "folk")
_ONSETS = "b br c d f g h k l m n p r s t v w z".split()
_VOWELS = "a e i o u a e i o ei".split()
_CODAS = ["", "", "n", "r", "l", "s", "th", "nd", "rk", "x"]
_PLACE_SUFFIX = ("ford", "holm", "by", "wick", "stad", "mere", "vale", "port")
_ADJ = (
    "Silent Amber Hollow Crimson Distant Broken Gilded Quiet Pale Restless Northern Burning Last "
    "Hidden Velvet Iron Drowned Lonely Second Winter"
).split()
_NOUN = (
    "Orchard Lantern Harbour Tide Mirror Engine Garden Archive Compass Meridian Bridge Furnace "
    "Chorus Atlas Ferry Signal Quarry Cathedral Vigil Letter"
).split()


@dataclass
class Entity:
    id: str  # "person-17"
    kind: str
    name: str
    attrs: dict[str, Any]
    links: dict[str, str] = field(default_factory=dict)  # relation -> target entity id
    ghost_of: str | None = None  # a near-namesake distractor of that entity


class Graph:
    def __init__(self, entities: dict[str, Entity]) -> None:
        self.entities = entities
        self.by_name = {e.name.lower(): e.id for e in entities.values()}
        if len(self.by_name) != len(entities):
            raise ValueError("entity names must be unique")
        self._inverse: dict[str, list[tuple[str, str]]] = {}
        for e in entities.values():
            for rel, dst in e.links.items():
                if e.ghost_of is None:
                    self._inverse.setdefault(dst, []).append((rel, e.id))

    def __getitem__(self, eid: str) -> Entity:
        return self.entities[eid]

    def of_kind(self, kind: str, ghosts: bool = False) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind and (ghosts or e.ghost_of is None)]

    def follow(self, eid: str, relation: str) -> str | None:
        return self.entities[eid].links.get(relation)

    def walk(self, start: str, relations: list[str]) -> str | None:
        """The entity reached from `start` along `relations` (None where an edge is missing)."""
        cur: str | None = start
        for rel in relations:
            cur = self.follow(cur, rel) if cur is not None else None
        return cur

    def inverse(self, eid: str) -> list[tuple[str, str]]:
        """(relation, subject id) of every real entity whose relation points at `eid` (page prose)."""
        return list(self._inverse.get(eid, []))

    def to_json(self) -> str:
        return json.dumps([e.__dict__ for e in self.entities.values()], sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Graph:
        return Graph({d["id"]: Entity(**d) for d in json.loads(text)})


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)


def _plural(noun: str) -> str:
    return noun[:-1] + "ies" if noun.endswith("y") else noun + ("es" if noun.endswith(("ch", "s")) else "s")


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(lo * (hi / lo) ** rng.random()))


class _Names:
    """Unique names across the whole graph (case-insensitive)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set()

    def take(self, make) -> str:
        for _ in range(1000):
            name = make()
            if name.lower() not in self.used:
                self.used.add(name.lower())
                return name
        raise RuntimeError("could not draw a unique name; enlarge the name space")

    def person(self) -> str:
        r = self.rng
        return self.take(lambda: f"{_word(r, r.randint(1, 2)).title()} {_word(r, r.randint(2, 3)).title()}")

    def organisation(self, industry: str) -> str:
        return self.take(lambda: f"{_word(self.rng, 2).title()} {INDUSTRIES[industry]}")

    def place(self) -> str:
        r = self.rng
        return self.take(lambda: _word(r, r.randint(1, 2)).title() + r.choice(_PLACE_SUFFIX))

    def work(self) -> str:
        r = self.rng
        forms = (
            lambda: f"The {r.choice(_ADJ)} {r.choice(_NOUN)}",
            lambda: f"{r.choice(_NOUN)} of {_word(r, 2).title()}",
            lambda: f"{r.choice(_ADJ)} {_plural(r.choice(_NOUN))}",
        )
        return self.take(lambda: r.choice(forms)())


def _attrs(kind: str, rng: random.Random, extra: dict | None = None) -> dict[str, Any]:
    if kind == "person":
        award = rng.choice(AWARDS) if rng.random() < 0.6 else None
        return {"occupation": rng.choice(OCCUPATIONS), "birth_year": rng.randint(1925, 1995), "award": award}
    if kind == "organisation":
        return {
            "industry": (extra or {}).get("industry") or rng.choice(list(INDUSTRIES)),
            "founded_year": rng.randint(1850, 2010),
            "employees": _log_uniform(rng, 20, 90_000),
        }
    if kind == "place":
        return {
            "place_kind": rng.choice(PLACE_KINDS),
            "founded_year": rng.randint(900, 1900),
            "population": _log_uniform(rng, 2_000, 900_000),
        }
    return {
        "work_kind": rng.choice(list(WORK_KINDS)),
        "genre": rng.choice(GENRES),
        "year": rng.randint(1950, 2024),
    }


def _ghost_name(e: Entity, names: _Names, rng: random.Random) -> str:
    """A near-namesake: a person with the same surname, an organisation or place one syllable off, a
    work with one word changed."""
    if e.kind == "person":
        return names.take(lambda: f"{_word(rng, rng.randint(1, 2)).title()} {e.name.split()[-1]}")
    if e.kind == "organisation":
        head, suffix = e.name.split(" ", 1)
        return names.take(lambda: f"{head[:-1]}{rng.choice(_VOWELS)}{rng.choice(_CODAS)} {suffix}".title())
    if e.kind == "place":
        return names.take(lambda: (e.name[:-2] + rng.choice(_VOWELS) + rng.choice(_PLACE_SUFFIX)).title())
    words = e.name.split()
    return names.take(lambda: " ".join(words[:-1] + [rng.choice(_NOUN)]))


def generate_graph(cfg: DeepDiveArgs) -> Graph:
    """Entities, attributes and relations from `cfg.seed` alone (same seed, same graph)."""
    rng = random.Random(f"deepdive-graph:{cfg.seed}")
    names = _Names(rng)
    ents: dict[str, Entity] = {}

    def add(kind: str, i: int, name: str, attrs: dict) -> Entity:
        ents[f"{kind}-{i}"] = e = Entity(f"{kind}-{i}", kind, name, attrs)
        return e

    people = [add("person", i, names.person(), _attrs("person", rng)) for i in range(cfg.people)]
    orgs = []
    for i in range(cfg.organisations):
        industry = list(INDUSTRIES)[i % len(INDUSTRIES)]  # every industry exists, so every work has a label
        orgs.append(
            add(
                "organisation",
                i,
                names.organisation(industry),
                _attrs("organisation", rng, {"industry": industry}),
            )
        )
    places = [add("place", i, names.place(), _attrs("place", rng)) for i in range(cfg.places)]
    works = [add("work", i, names.work(), _attrs("work", rng)) for i in range(cfg.works)]

    for p in people:
        p.links["born_in"] = rng.choice(places).id
        p.links["works_for"] = rng.choice(orgs).id
    for o in orgs:
        o.links["headquartered_in"] = rng.choice(places).id
        older = [p for p in people if p.attrs["birth_year"] <= o.attrs["founded_year"] - 20]
        o.links["founded_by"] = rng.choice(older or people).id
    for pl, mayor in zip(places, rng.sample(people, min(len(places), len(people))), strict=False):
        pl.links["mayor"] = mayor.id
    shuffled = rng.sample(places, len(places))
    for a, b in zip(shuffled[0::2], shuffled[1::2], strict=False):  # symmetric pairs
        a.links["twinned_with"], b.links["twinned_with"] = b.id, a.id
    for w in works:
        creator = rng.choice(people)
        w.links["created_by"] = creator.id
        w.attrs["year"] = max(w.attrs["year"], creator.attrs["birth_year"] + 18)
        labels = [o for o in orgs if o.attrs["industry"] == WORK_KINDS[w.attrs["work_kind"]]]
        w.links["published_by"] = rng.choice(labels).id
        w.links["set_in"] = rng.choice(places).id
    for p in people:  # the earliest work a person created (functional: ties broken by id)
        own = sorted(
            (w.attrs["year"], int(w.id.split("-")[1]), w.id) for w in works if w.links["created_by"] == p.id
        )
        if own:
            p.links["debut_work"] = own[0][2]

    real = list(ents.values())
    for e in rng.sample(real, round(cfg.near_duplicates * len(real))):
        attrs = dict(e.attrs)
        for key, value in attrs.items():  # overlapping but not identical attributes
            if key.endswith("year") and isinstance(value, int):
                attrs[key] = value + rng.choice([-2, -1, 1, 2])
        kind_count = sum(x.kind == e.kind for x in ents.values())
        ghost = add(e.kind, kind_count, _ghost_name(e, names, rng), attrs)
        ghost.ghost_of = e.id
        for rel, dst in e.links.items():  # its own facts, pointing at random real entities
            if rel in ("debut_work", "twinned_with"):  # would contradict the other entity's page
                continue
            pool = [x for x in real if x.kind == ents[dst].kind]
            ghost.links[rel] = rng.choice(pool).id
    return Graph(ents)
