"""The budgets that span a tree: depth, children per node, nodes per tree. A launch reserves its
node before the child starts (as Platoon does), so concurrent launches can never overshoot."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TreeBudget:
    max_depth: int
    max_children: int
    max_nodes: int
    nodes_started: int = 1  # the root

    def reserve_child(self, depth: int, children_so_far: int) -> str | None:
        """Reserve a node for a launch from depth `depth`; returns a refusal message or None."""
        if depth + 1 > self.max_depth:
            return (
                f"Refused: sub-agents cannot go deeper than depth {self.max_depth}. "
                "Do this work yourself without launch_subagent."
            )
        if children_so_far >= self.max_children:
            return f"Refused: a node may start at most {self.max_children} sub-agents. Do the rest yourself."
        if self.nodes_started >= self.max_nodes:
            return f"Refused: the tree reached its limit of {self.max_nodes} agents. Do the rest yourself."
        self.nodes_started += 1
        return None

    def release_child(self) -> None:
        """A reserved launch that did not start (its arguments were wrong)."""
        self.nodes_started -= 1
