"""Split a model reply into reasoning and one Python cell.

Each format profile says how a cell is delimited and where generation stops. The reference format
is `<thought>...</thought>` then `<python>...</python>`, stopping at `</python>`; real models that
prefer Markdown can use fenced code blocks instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplyFormat:
    name: str
    stop: tuple[str, ...]
    cell_pattern: re.Pattern
    thought_pattern: re.Pattern | None
    instructions: str  # how the system prompt explains the format

    def wrap(self, thought: str, code: str) -> str:
        """A reply in this format (scripted policies write their cells through it)."""
        if self.name == "thought_python":
            return f"<thought>{thought}</thought>\n<python>\n{code}\n</python>"
        if self.name == "python":
            return f"<python>\n{code}\n</python>"
        return f"{thought}\n```python\n{code}\n```"


FORMATS = {
    "thought_python": ReplyFormat(
        name="thought_python",
        stop=("</python>",),
        cell_pattern=re.compile(r"<python>\n?(.*?)\n?</python>", re.S),
        thought_pattern=re.compile(r"<thought>(.*?)</thought>", re.S),
        instructions=(
            "Each reply: a short reasoning in <thought>...</thought>, then exactly one Python cell in "
            "<python>...</python>. The cell runs in a persistent REPL; what it prints comes back to you."
        ),
    ),
    # Terse, for tiny models that read and write every token: a thought buys them nothing.
    "python": ReplyFormat(
        name="python",
        stop=("</python>",),
        cell_pattern=re.compile(r"<python>\n?(.*?)\n?</python>", re.S),
        thought_pattern=None,
        instructions="Reply with one Python cell in <python>...</python>; you see its output.",
    ),
    "markdown": ReplyFormat(
        name="markdown",
        stop=("\n```\n",),
        cell_pattern=re.compile(r"```python\n(.*?)(?:\n```|$)", re.S),
        thought_pattern=None,
        instructions=(
            "Each reply: a short reasoning, then exactly one Python cell in a ```python fenced block. "
            "The cell runs in a persistent REPL; what it prints comes back to you."
        ),
    ),
}


@dataclass
class ParsedReply:
    thought: str
    code: str | None
    error: str | None  # why no cell could be read; shown to the model as its observation


def get_format(name: str) -> ReplyFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown reply format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name]


def parse_reply(text: str, fmt: ReplyFormat) -> ParsedReply:
    thought = ""
    if fmt.thought_pattern is not None and (m := fmt.thought_pattern.search(text)):
        thought = m.group(1).strip()
    cells = fmt.cell_pattern.findall(text)
    if not cells:
        return ParsedReply(thought, None, f"Error: no Python cell found. {fmt.instructions}")
    code = cells[0].strip("\n")
    if not code.strip():
        return ParsedReply(thought, None, "Error: the Python cell is empty.")
    return ParsedReply(thought, code, None)
