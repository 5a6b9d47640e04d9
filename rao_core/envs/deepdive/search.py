"""Search engines behind the deep-search tools: a small interface any backend implements, and the
default one, BM25 over the local corpus.

BM25 scoring comes from `bm25s` (numpy only, no network; DuckDB's full-text extension would have to
be downloaded, which these machines cannot do). Tokenisation is ours and shared by documents and
queries: lowercase alphanumeric runs minus English stopwords, so names and years are exact terms.
"""

from __future__ import annotations

import importlib
import re
from typing import Protocol, runtime_checkable

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

from rao_core.envs.deepdive.corpus import SITE, Page, slug

_TOKEN = re.compile(r"[a-z0-9]+")
_STOP = set(STOPWORDS_EN) | {"s", "is", "was", "has", "its", "it", "who", "what", "which", "name", "find"}
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOP]


@runtime_checkable
class SearchBackend(Protocol):
    """What `search_web` and `view_webpage_content` need. A real web backend (an HTTP search API
    plus a page fetcher) implements these two methods and is named in `suite_args.backend`."""

    def search(self, query: str, max_results: int) -> list[dict[str, str]]:
        """Ranked results, best first: [{"title", "url", "snippet"}, ...] (may be empty)."""
        ...

    def fetch(self, url: str) -> tuple[str, str] | None:
        """(title, full text) of the page at `url`, or None if there is no such page."""
        ...


def snippet(text: str, query_tokens: set[str], limit: int = 200) -> str:
    """The sentence sharing most distinct terms with the query (the first on ties), cut to `limit`."""
    best, best_score = "", -1
    for sentence in _SENTENCE.split(text):
        score = len(query_tokens & set(tokenize(sentence)))
        if score > best_score and sentence.strip():
            best, best_score = sentence.strip(), score
    return best if len(best) <= limit else best[: limit - 3].rstrip() + "..."


class BM25Backend:
    """BM25 (Lucene variant, k1 = 1.2, b = 0.75) over page titles (counted twice: a title match is
    worth more) and texts. Ties keep corpus order, so rankings are deterministic."""

    def __init__(self, pages: list[Page], k1: float = 1.2, b: float = 0.75) -> None:
        self.pages = pages
        self.by_slug = {p.url.removeprefix(SITE): p for p in pages}
        self.index = bm25s.BM25(k1=k1, b=b)
        docs = [tokenize(f"{p.title}\n{p.title}\n{p.text}") for p in pages]
        self.index.index(docs, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        tokens = tokenize(query)
        if not tokens:
            return np.zeros(len(self.pages), dtype=np.float32)
        return self.index.get_scores(tokens)

    def search(self, query: str, max_results: int) -> list[dict[str, str]]:
        scores = self.scores(query)
        order = np.argsort(-scores, kind="stable")[:max_results]
        terms = set(tokenize(query))
        return [
            {
                "title": self.pages[i].title,
                "url": self.pages[i].url,
                "snippet": snippet(self.pages[i].text, terms),
            }
            for i in order
            if scores[i] > 0
        ]

    def fetch(self, url: str) -> tuple[str, str] | None:
        """A full URL, one without its scheme, the bare path part, or the exact title."""
        key = url.strip()
        page = self.by_slug.get(key.split("/wiki/")[-1].strip("/")) or self.by_slug.get(slug(key))
        return None if page is None else (page.title, page.text)


def load_backend(spec: str, pages: list[Page], cfg=None) -> SearchBackend:
    """`bm25` (the local corpus) or `package.module:factory`, called with the DeepDiveArgs."""
    if spec == "bm25":
        return BM25Backend(pages)
    module, sep, name = spec.partition(":")
    if not sep:
        raise ValueError(f"suite_args.backend: expected 'bm25' or 'module:factory', got {spec!r}")
    backend = getattr(importlib.import_module(module), name)(cfg)
    if not isinstance(backend, SearchBackend):
        raise ValueError(f"suite_args.backend: {spec} did not return a SearchBackend (search + fetch)")
    return backend
