"""The graph rendered as a small local web: one page per entity (prose with its facts, the facts
other entities hold about it, filler, and a list of links), plus list pages ("People born in X")
that mention many entities at once, so a search returns competing pages as on the real web.

Every fact on every page is read off the graph, so pages never contradict the answers; ghost
(near-namesake) pages state only their own facts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from rao_core.envs.deepdive.graph import RELATIONS, Entity, Graph

SITE = "https://dd.local/wiki/"


@dataclass(frozen=True)
class Page:
    url: str
    title: str
    text: str
    entity_id: str  # "" for list pages


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def url_of(title: str) -> str:
    return SITE + slug(title)


def _fact(g: Graph, e: Entity, rel: str) -> str:
    """One sentence stating `e --rel--> target` with the relation's own words (searchable)."""
    t = g[e.links[rel]].name
    s = e.name.split()[-1] if e.kind == "person" else e.name
    return {
        "born_in": f"{s} was born in {t}.",
        "works_for": f"{s} works for {t}.",
        "debut_work": f"The debut work of {s} was {t}.",
        "headquartered_in": f"{s} is headquartered in {t}.",
        "founded_by": f"{s} was founded by {t}.",
        "mayor": f"The mayor of {s} is {t}.",
        "twinned_with": f"{s} is twinned with {t}.",
        "created_by": f"{s} was created by {t}.",
        "published_by": f"{s} was released by {t}.",
        "set_in": f"{s} is set in {t}.",
    }[rel]


def _inverse_fact(g: Graph, e: Entity, rel: str, subject: Entity) -> str | None:
    """What the object's page says about a fact that points at it (None: too many to list)."""
    s = e.name.split()[-1] if e.kind == "person" else e.name
    return {
        "founded_by": f"{s} founded {subject.name}.",
        "mayor": f"{s} serves as mayor of {subject.name}.",
        "created_by": f"{s} created the {subject.attrs.get('work_kind', 'work')} {subject.name}.",
        "published_by": f"{s} released {subject.name}.",
        "headquartered_in": f"{subject.name} has its headquarters in {s}.",
    }.get(rel)


def _intro(e: Entity) -> str:
    a = e.attrs
    if e.kind == "person":
        award = f" {e.name.split()[-1]} received {a['award']}." if a["award"] else ""
        return f"{e.name} (born {a['birth_year']}) is a {a['occupation']}.{award}"
    if e.kind == "organisation":
        return (
            f"{e.name} is a {a['industry']} company founded in {a['founded_year']}. "
            f"It has {a['employees']:,} employees."
        )
    if e.kind == "place":
        return (
            f"{e.name} is a {a['place_kind']} founded in {a['founded_year']}, "
            f"with a population of {a['population']:,}."
        )
    return f"{e.name} is a {a['year']} {a['genre']} {a['work_kind']}."


_FILLER = [
    "{s} is mentioned in several regional archives.",
    "Little is recorded about the early years of {s}.",
    "Accounts of {s} differ in minor details between sources.",
    "A short profile of {s} appeared in a local gazette.",
    "{s} has been the subject of a small exhibition.",
    "Visitors often confuse {s} with similarly named subjects.",
    "Records about {s} were digitised in a recent archive project.",
]


def entity_page(g: Graph, e: Entity, rng: random.Random) -> Page:
    s = e.name.split()[-1] if e.kind == "person" else e.name
    sentences = [_intro(e)] + [_fact(g, e, rel) for rel in RELATIONS if rel in e.links]
    linked = [g[dst] for dst in e.links.values()]
    if e.ghost_of is None:
        inverse = [(rel, g[sid]) for rel, sid in g.inverse(e.id)]
        for rel, subject in sorted(inverse, key=lambda x: (x[0], x[1].name))[:8]:
            line = _inverse_fact(g, e, rel, subject)
            if line:
                sentences.append(line)
                linked.append(subject)
    fill = [f.format(s=s) for f in rng.sample(_FILLER, rng.randint(1, 3))]
    body = " ".join(sentences[:2] + fill[:1] + sentences[2:] + fill[1:])
    links = "\n".join(f"- {name}: {url_of(name)}" for name in dict.fromkeys(x.name for x in linked))
    return Page(url_of(e.name), e.name, f"{e.name}\n\n{body}\n\nLinks:\n{links}\n", e.id)


def list_pages(g: Graph) -> list[Page]:
    """Pages that mention many entities: people by birthplace, companies by industry."""
    pages = []
    for place in g.of_kind("place"):
        people = [p for p in g.of_kind("person") if p.links.get("born_in") == place.id]
        if len(people) >= 2:
            title = f"People born in {place.name}"
            rows = "\n".join(
                f"- {p.name}, {p.attrs['occupation']} (born {p.attrs['birth_year']})" for p in people
            )
            pages.append(Page(url_of(title), title, f"{title}\n\n{rows}\n", ""))
    for industry in sorted({o.attrs["industry"] for o in g.of_kind("organisation")}):
        orgs = [o for o in g.of_kind("organisation") if o.attrs["industry"] == industry]
        title = f"List of {industry} companies"
        rows = "\n".join(f"- {o.name}, founded {o.attrs['founded_year']}" for o in orgs)
        pages.append(Page(url_of(title), title, f"{title}\n\n{rows}\n", ""))
    return pages


def render_corpus(g: Graph, seed: int) -> list[Page]:
    """Every page of the local web, in a fixed order (entity pages, then list pages)."""
    rng = random.Random(f"deepdive-corpus:{seed}")
    pages = [entity_page(g, e, rng) for e in g.entities.values()] + list_pages(g)
    if len({p.url for p in pages}) != len(pages):
        raise ValueError("two pages share a URL")
    return pages


def write_pages(pages: list[Page], path) -> None:
    table = pa.table({k: [getattr(p, k) for p in pages] for k in ("url", "title", "text", "entity_id")})
    pq.write_table(table, path)


def load_pages(path) -> list[Page]:
    return [Page(**r) for r in pq.read_table(path).to_pylist()]
