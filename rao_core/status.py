"""The outcomes of a node and of a tree, by name. The nodes table stores these names and the SQL
reads them (sql/*.sql: `status = 'finished'`, `tree_status = 'infra_error'`, ...);
tests/store/test_statuses.py checks that every name the SQL uses is one of these."""

from __future__ import annotations

from enum import StrEnum


class NodeStatus(StrEnum):
    FINISHED = "finished"  # called finish(message)
    BUDGET = "budget"  # used up its steps
    CONTEXT_OVERFLOW = "context_overflow"  # its conversation outgrew agent.max_context_tokens
    LOOP = "loop"  # sent the same cell agent.loop_guard times in a row
    TIMEOUT = "timeout"  # a cell ran past agent.cell_timeout_s, or the tree's wall clock ran out
    ERROR = "error"  # a cell crashed its REPL worker
    INFRA_ERROR = "infra_error"  # a component failed (engine, sandbox start, judge, scorer): not the policy


class TreeStatus(StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"  # agent.tree_timeout_s ran out: left out of its group
    INFRA_ERROR = "infra_error"  # a component failed in the tree: left out of its group
