"""The two deep-search tools of the REPL, with the reference signatures, over any SearchBackend.

They take JSON arguments from model-written cells, so they never raise: a bad argument comes back
as a one-line "Error: ..." string. Long pages come back in windows of `page_chars` characters, cut
at a word boundary, with the call that reads on; a cell's output is truncated again by the runtime
(agent.max_observation_chars), so keep page_chars below it.
"""

from __future__ import annotations

from typing import Any

from rao_core.envs.deepdive.search import SearchBackend

MAX_RESULTS_CAP = 10


class WebTools:
    def __init__(self, backend: SearchBackend, max_results: int = 5, page_chars: int = 3000) -> None:
        self.backend, self.max_results, self.page_chars = backend, max_results, page_chars

    def search_web(self, query: Any = None, max_results: Any = None) -> list[dict[str, str]] | str:
        """Ranked results [{"title", "url", "snippet"}] for `query`; at most 10."""
        if not isinstance(query, str) or not query.strip():
            return "Error: query must be a non-empty string."
        n = self.max_results if max_results is None else max_results
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            return f"Error: max_results must be a positive int, got {max_results!r}."
        return self.backend.search(query[:500], min(n, MAX_RESULTS_CAP))

    def view_webpage_content(self, url: Any = None, start: Any = 0) -> str:
        """The page's text from character `start`, at most `page_chars` characters."""
        if not isinstance(url, str) or not url.strip():
            return "Error: url must be a non-empty string (a url from search_web results)."
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            return f"Error: start must be a non-negative int, got {start!r}."
        page = self.backend.fetch(url)
        if page is None:
            return f"Error: no page at {url!r}. Use a url from search_web results."
        _, text = page
        if start >= len(text):
            return f"Error: start {start} is past the end of the page ({len(text)} characters)."
        end = start + self.page_chars
        if end < len(text):
            space = text.rfind(" ", start, end)
            end = space if space > start + self.page_chars * 4 // 5 else end
            more = len(text) - end
            return (
                f"{text[start:end]}\n[... {more} more characters: view_webpage_content({url!r}, start={end})]"
            )
        return text[start:]
