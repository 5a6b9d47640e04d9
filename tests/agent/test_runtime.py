"""The node loop and tree runner: budgets, refusals, failures returned as strings, concurrency."""

from __future__ import annotations

import asyncio
import json

from rao_core.agent.prompts import ChatFraming
from rao_core.agent.runner import run_trees
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import AgentConfig, SandboxConfig
from rao_core.envs.base import Environment, LaunchError
from rao_core.models.tokenizer import tiny_tokenizer
from tests.conftest import CellScript


class NoteEnv(Environment):
    """A minimal generic environment: a shared notebook; success = finished with the goal's word."""

    suite = "note"

    def __init__(self, goal: str, notes: list[str] | None = None, context: str | None = None) -> None:
        self.goal, self.notes, self.context = goal, notes if notes is not None else [], context

    def goal_text(self) -> str:
        return self.goal

    def targets(self) -> dict:
        return {"goal": self.goal}

    def tools(self):
        return {"note": lambda text: self.notes.append(str(text)) or len(self.notes)}

    def tool_docs(self, recursive: bool) -> str:
        return "note(text) -> int" + (
            "\nawait launch_subagent(goal, context=None) -> str" if recursive else ""
        )

    def fork(self, goal=None, context=None) -> NoteEnv:
        if not isinstance(goal, str) or not goal:
            raise LaunchError("goal must be a non-empty string")
        return NoteEnv(goal, self.notes, context)

    def success(self, finished: bool, finish_message: str) -> float:
        return float(finished and self.goal.split()[-1] in finish_message)

    def context_chars(self) -> int:
        return len(self.context or "")

    def repl_variables(self) -> dict:
        return {"context": self.context} if self.context is not None else {}


CHAT = ChatFraming(tiny_tokenizer())


def run_tree(policy, env=None, **agent) -> TreeRun:
    base = {
        "cell_timeout_s": 5.0,
        "tree_timeout_s": 60.0,
        "reply_format": "thought_python",
        "max_context_tokens": 8192,
    }
    cfg = AgentConfig(**{**base, **agent})
    (tree,) = asyncio.run(
        run_trees([TreeSpec("t", 0, env or NoteEnv("say ok"))], policy, CHAT, cfg, SandboxConfig())
    )
    return tree


def by_path(tree: TreeRun) -> dict[str, object]:
    return {r.node_id.split(":")[1]: r for r in tree.records}


def fan_out(n: int, child_cell: str = "finish('child ok')"):
    def script(node):
        if node.depth > 0:
            return child_cell
        if node.turn == 0:
            calls = ", ".join(f"launch_subagent('part {i}')" for i in range(n))
            return f"r = await asyncio.gather({calls})\nprint(r)"
        return "finish('root ok')"

    return script


def test_fan_out_records_and_tokens():
    tree = run_tree(CellScript(fan_out(3)))
    nodes = by_path(tree)
    assert set(nodes) == {"0", "0.1", "0.2", "0.3"}
    root = nodes["0"]
    assert root.status == "finished" and root.success == 1.0 and root.children == 3
    assert "['child ok', 'child ok', 'child ok']" in root.transcript  # children's answers came back
    for path in ("0.1", "0.2", "0.3"):
        child = nodes[path]
        assert child.parent_id == root.node_id and child.depth == 1 and child.status == "finished"
        assert "launch_subagent" in child.transcript  # same system prompt, fresh context
        assert "root ok" not in child.transcript and "part" in child.goal
    for rec in tree.records:
        assert len(rec.token_ids) == len(rec.action_mask) and 0 < sum(rec.action_mask) < len(rec.token_ids)
        assert rec.logprobs == []  # scripted policy: no sampler log-probs
        assert CHAT.tokenizer.decode(rec.token_ids) == rec.transcript


def test_action_mask_covers_exactly_the_replies():
    tree = run_tree(CellScript(lambda n: "print(40 + 2)" if n.turn == 0 else "finish('ok')"))
    rec = tree.records[0]
    actions = [t for t, m in zip(rec.token_ids, rec.action_mask, strict=True) if m]
    text = CHAT.tokenizer.decode(actions)
    assert text.count("<python>") == 2 and "42" not in text  # the observation is not an action
    assert "42" in rec.transcript


def test_siblings_run_concurrently():
    """Three children that each take 2 turns of 0.3 s overlap in time: each starts before any ends."""
    tree = run_tree(CellScript(fan_out(3, "print(1)"), latency_s=0.3), max_steps=3)
    children = [r for r in tree.records if r.depth == 1]
    assert len(children) == 3
    assert max(c.started_at for c in children) < min(c.ended_at for c in children)


def test_depth_cap_refuses_with_message():
    tree = run_tree(CellScript(fan_out(2)), max_depth=0)
    root = by_path(tree)["0"]
    assert len(tree.records) == 1 and root.refused_launches == 2 and root.children == 0
    assert "Refused: sub-agents cannot go deeper than depth 0" in root.transcript
    assert root.status == "finished"


def test_children_and_node_budgets():
    tree = run_tree(CellScript(fan_out(4)), max_children=2)
    assert by_path(tree)["0"].refused_launches == 2 and len(tree.records) == 3
    tree = run_tree(CellScript(fan_out(4)), max_nodes=3)
    assert by_path(tree)["0"].refused_launches == 2 and len(tree.records) == 3


def test_bad_launch_arguments_return_error_string():
    tree = run_tree(
        CellScript(lambda n: "print(await launch_subagent(''))" if n.turn == 0 else "finish('ok')")
    )
    assert len(tree.records) == 1
    assert "Error: goal must be a non-empty string" in tree.records[0].transcript


def test_child_failure_comes_back_as_string():
    def script(node):
        if node.depth == 1:
            return f"print({node.turn})"  # never finishes: runs out of steps
        return "r = await launch_subagent('fail')\nprint('got:', r)" if node.turn == 0 else "finish('ok')"

    tree = run_tree(CellScript(script), max_steps=3)
    nodes = by_path(tree)
    assert nodes["0.1"].status == "budget" and nodes["0.1"].success == 0.0
    assert "got: Sub-agent failed: did not finish before its step budget." in nodes["0"].transcript
    assert nodes["0"].status == "finished"


def test_step_budget_loop_guard_and_context_overflow():
    counting = CellScript(lambda n: f"print({n.turn})")
    assert run_tree(counting, max_steps=4).records[0].status == "budget"
    tree = run_tree(CellScript(lambda n: "print('same')"), loop_guard=3)
    assert tree.records[0].status == "loop" and tree.records[0].turns == 3
    tree = run_tree(counting, max_context_tokens=400)
    rec = tree.records[0]
    assert rec.status == "context_overflow" and rec.success == 0.0


def test_cell_timeout_ends_only_that_node():
    def script(node):
        if node.depth == 1:
            return "while True: pass" if "spin" in node.env.goal else "finish('fine')"
        if node.turn == 0:
            return "print(await asyncio.gather(launch_subagent('spin'), launch_subagent('be fine')))"
        return "finish('ok')"

    tree = run_tree(CellScript(script), cell_timeout_s=1.0)
    nodes = {r.goal: r for r in tree.records}
    assert nodes["spin"].status == "timeout"
    assert nodes["be fine"].status == "finished"
    assert nodes["say ok"].status == "finished"
    assert "Sub-agent failed: ran out of time" in nodes["say ok"].transcript


def test_tree_wall_clock_budget():
    tree = run_tree(CellScript(lambda n: "print(1)", latency_s=0.3), tree_timeout_s=1.0)
    assert tree.status == "timeout"
    assert [r.status for r in tree.records] == ["timeout"]


def test_context_variable_and_generic_launch():
    def script(node):
        if node.depth == 1:
            return "finish(f'len {len(context)} ok')"
        return (
            "print(await launch_subagent('count it', context='abc' * 1000))"
            if node.turn == 0
            else "finish('ok')"
        )

    tree = run_tree(CellScript(script))
    child = by_path(tree)["0.1"]
    assert child.context_chars == 3000 and child.finish_message == "len 3000 ok"
    assert "abcabc" not in child.transcript  # context lives in the REPL, not the prompt


def test_single_mode_has_no_launch_subagent():
    tree = run_tree(CellScript(lambda n: "print(launch_subagent)"), mode="single", max_steps=1)
    rec = tree.records[0]
    assert "NameError" in rec.transcript
    assert "launch_subagent(goal" not in rec.transcript.split("<|im_start|>user")[0]


def test_targets_are_json():
    tree = run_tree(CellScript(lambda n: "finish('ok')"))
    assert json.loads(tree.records[0].targets) == {"goal": "say ok"}


def test_object_addresses_are_masked_in_observations():
    """A repr's address differs between worker processes, so a seeded rerun would see other tokens."""
    from rao_core.agent.prompts import mask_addresses

    assert mask_addresses("<function sub at 0x7f3a74544cc0>") == "<function sub>"
    assert mask_addresses("0x7f3a and <object object at 0xABC123>") == "0x7f3a and <object object>"
    tree = run_tree(
        CellScript(lambda n: "print(launch_subagent, object())" if n.turn == 0 else "finish('ok')")
    )
    rec = tree.records[0]
    assert "<function" in rec.transcript and "<object object>" in rec.transcript
    assert " at 0x" not in rec.transcript
