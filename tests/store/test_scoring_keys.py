"""Scoring joins and groups on 64-bit hash keys of the ids: a collision must be an error, never a
silently merged node, tree or group; malformed trees are still named by their string ids."""

from __future__ import annotations

import random

import pytest

from rao_core.config import ScoringConfig
from rao_core.scoring import score_round
from rao_core.store import sqlfiles
from tests.store.forest import node_table, random_forest, write_round


@pytest.mark.parametrize("column", ["node_id", "tree_id", "task_id"])
def test_hash_collision_is_an_error(tmp_path, monkeypatch, column):
    """Force every id of one key space onto one key (hash(x) % 1): checks.sql must refuse it."""
    load = sqlfiles.load_sql

    def colliding(name: str) -> str:
        sql = load(name)
        return sql if name == "checks_named" else sql.replace(f"hash({column})", f"(hash({column}) % 1)")

    monkeypatch.setattr(sqlfiles, "load_sql", colliding)
    write_round(tmp_path, 0, node_table(random_forest(random.Random(1), n_tasks=3, group_size=3)))
    with pytest.raises(ValueError, match="share a 64-bit hash key"):
        score_round(tmp_path, 0, ScoringConfig())
    assert not (tmp_path / "scores").exists()


def test_child_in_another_tree_is_refused(tmp_path):
    cols = {
        "task_id": ["a"] * 3,
        "tree_id": ["a/0", "a/1", "a/1"],
        "node_id": ["a/0:0", "a/1:0", "a/1:0.0"],
        "parent_id": [None, None, "a/0:0"],
        "depth": [0, 0, 1],
    }
    write_round(tmp_path, 0, node_table(cols))
    with pytest.raises(
        ValueError, match=r"malformed.*node a/1:0\.0 \(tree a/1\) has parent a/0:0 in tree a/0"
    ):
        score_round(tmp_path, 0, ScoringConfig())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"node_id": ["a/0:0", "a/0:0.0", "a/0:0.0"]}, "duplicate node_id a/0:0.0"),
        ({"parent_id": [None, "a/0:0", None]}, "tree a/0: 2 roots, 1 task ids, root depth 0"),
        ({"task_id": ["a", "a", "b"]}, "tree a/0: 1 roots, 2 task ids"),
        ({"depth": [1, 2, 2]}, "tree a/0: 1 roots, 1 task ids, root depth 1"),
    ],
)
def test_malformed_trees_are_named(tmp_path, change, message):
    cols = {
        "task_id": ["a"] * 3,
        "tree_id": ["a/0"] * 3,
        "node_id": ["a/0:0", "a/0:0.0", "a/0:0.1"],
        "parent_id": [None, "a/0:0", "a/0:0"],
        "depth": [0, 1, 1],
        **change,
    }
    write_round(tmp_path, 0, node_table(cols))
    with pytest.raises(ValueError, match="malformed") as err:
        score_round(tmp_path, 0, ScoringConfig())
    assert message in str(err.value)
