"""Documentation that must match the code."""

from pathlib import Path

from rao_core.store.schema import NODE_FIELDS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_node_column_is_documented():
    text = (DOCS / "tables.md").read_text()
    missing = [name for name, _, _ in NODE_FIELDS if f"| {name} " not in text and f" {name}," not in text]
    assert missing == []
