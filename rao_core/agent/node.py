"""One agent instance: the turn loop of a node, as steps.

    node.run():  start its REPL -> step() until an outcome -> close the REPL -> its record
    step():      generate a reply -> parse its cell -> run it -> append the observation

A node ends on finish(), on a budget (steps, context), on a repeated cell (loop guard), on a cell
timeout or a crashed REPL, or when the tree is cancelled: the policy's outcomes (NodeStatus). A
component that fails (the engine after its retries, a REPL worker that cannot start, a scorer that
raises: rao_core/errors.py) ends the node as `infra_error` instead, and its tree is left out of
training. Anything else is a bug: it raises, after the record is written. A node sees its tree only
through its NodeContext (budgets, where its record goes); it never imports the tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rao_core.agent.budget import TreeBudget
from rao_core.agent.conversation import Conversation
from rao_core.agent.executor import Executor, SandboxExecutors, is_async
from rao_core.agent.parsing import ReplyFormat, parse_reply
from rao_core.agent.prompts import ChatFraming, mask_addresses, system_prompt, truncate, user_prompt
from rao_core.config import AgentConfig
from rao_core.envs.base import Environment, ScorerError, score, scorer_name
from rao_core.errors import EngineError, InfrastructureError, retrying
from rao_core.policy import Generation, GenerationRequest, NodeState, Policy
from rao_core.status import NodeStatus

_scorer_failure_said = False  # the first scorer failure of this process (one command) was said


@contextlib.contextmanager
def quiet_scorer_failures() -> Iterator[None]:
    """For a caller that says the failure itself (`rao train --check` refuses it in one line)."""
    global _scorer_failure_said
    said, _scorer_failure_said = _scorer_failure_said, True
    try:
        yield
    finally:
        _scorer_failure_said = said


def say_first_scorer_failure(node_id: str, why: str) -> None:
    """A scorer bug is the suite's, and silent in the rows: the first of a command is said at once,
    on one line (the round's line counts the rest; rao_core/campaign.py stops a campaign on them)."""
    global _scorer_failure_said
    if not _scorer_failure_said:
        _scorer_failure_said = True
        line = " ".join(why.split())
        print(
            f"scorer error, node {node_id}: {line} (the node fails as infra_error)",
            file=sys.stderr,
            flush=True,
        )


@dataclass
class NodeRecord:
    node_id: str
    parent_id: str | None
    depth: int
    goal: str
    targets: str
    temperature: float = 1.0  # what the node's actions were sampled at (its log-probs are at it)
    status: str = NodeStatus.INFRA_ERROR  # until the node reaches an outcome of its own
    finish_message: str = ""
    success: float = 0.0
    success_source: str = "verifier"  # verifier, judge or root_proxy (TreeRun.judge_later)
    judge_verdict: str | None = None  # the judge's JSON verdict, None without a judge
    turns: int = 0
    children: int = 0
    refused_launches: int = 0
    started_at: float = field(default_factory=time.time)
    ended_at: float = 0.0
    context_chars: int = 0
    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    transcript: str = ""

    def result_for_parent(self) -> str:
        """What launch_subagent returns: the finish message, or a short failure string."""
        if self.status == NodeStatus.FINISHED:
            return self.finish_message
        reasons = {
            NodeStatus.BUDGET: "did not finish before its step budget",
            NodeStatus.CONTEXT_OVERFLOW: "ran out of context before finishing",
            NodeStatus.LOOP: "repeated the same cell and was stopped",
            NodeStatus.TIMEOUT: "ran out of time before finishing",
        }
        return f"Sub-agent failed: {reasons.get(self.status, 'failed before finishing')}."


@dataclass
class NodeContext:
    """What a node sees of its tree (rao_core/agent/tree.py builds it): the policy and how to talk
    to it, the limits, the tree's budget, where cells run, and where its record and failures go."""

    tree_id: str
    seed: int
    policy: Policy
    chat: ChatFraming
    fmt: ReplyFormat
    agent: AgentConfig
    temperature: float
    engine_attempts: int
    budget: TreeBudget
    executors: SandboxExecutors
    on_record: Callable[[NodeRecord, dict | None], None]  # the ended node, and its judge inputs if any
    on_infra_failure: Callable[[str, str], None]  # (kind, message)
    tool_turns: asyncio.Lock = field(default_factory=asyncio.Lock)  # Environment.shared_state

    @property
    def recursive(self) -> bool:
        return self.agent.mode == "recursive"


def request_seed(tree_seed: int, tree_id: str, path: str, turn: int) -> int:
    """The seed of one sampling request: a function of (seed, tree, node, turn) only, so a rerun
    samples the same tokens whatever else shares the batch and whenever it arrives."""
    digest = hashlib.sha256(f"{tree_seed}|{tree_id}|{path}|{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: fits every engine's seed type


def node_rng(tree_seed: int, tree_id: str, path: str) -> random.Random:
    """A per-node generator that depends only on (seed, tree, node path): reruns are identical."""
    digest = hashlib.sha256(f"{tree_seed}|{tree_id}|{path}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


async def run_node(
    ctx: NodeContext, env: Environment, path: str, depth: int, parent_id: str | None
) -> NodeRecord:
    return await Node(ctx, env, path, depth, parent_id).run()


class Node:
    def __init__(
        self, ctx: NodeContext, env: Environment, path: str, depth: int, parent_id: str | None
    ) -> None:
        self.ctx, self.env, self.path = ctx, env, path
        cfg = ctx.agent
        self.rec = NodeRecord(
            node_id=f"{ctx.tree_id}:{path}",
            parent_id=parent_id,
            depth=depth,
            goal=env.goal_text(),
            targets=json.dumps(env.targets(), sort_keys=True),
            temperature=ctx.temperature,
            context_chars=env.context_chars(),
        )
        rng = node_rng(ctx.seed, ctx.tree_id, path)
        self.state = NodeState(self.rec.node_id, depth, cfg.max_depth, ctx.recursive, env, rng=rng)
        prompt = ctx.chat.initial_ids(
            system_prompt(env, ctx.fmt, cfg, ctx.recursive), user_prompt(env, depth, cfg)
        )
        self.conv = Conversation(prompt)
        self.finish_message: str | None = None  # set by the cell's finish() call
        self.bug: Exception | None = None  # raised in a child node while a cell waited on it
        self.recent: list[str] = []  # the last cells, for the loop guard
        self.executor: Executor | None = None

    async def run(self) -> NodeRecord:
        rec = self.rec
        try:
            self.executor = await self.ctx.executors.start(self.env, self.ctx.recursive)
            rec.status = NodeStatus.BUDGET
            for turn in range(self.ctx.agent.max_steps):
                outcome = await self.step(turn)
                if outcome is not None:
                    rec.status = outcome
                    break
        except asyncio.CancelledError:
            rec.status, rec.finish_message = NodeStatus.TIMEOUT, "tree wall-clock budget exhausted"
            raise
        except InfrastructureError as e:  # a component failed: never the policy's fault
            self._infra_failure(e)
        finally:
            if self.executor is not None:
                await asyncio.shield(self.executor.close())
            await self._finish()  # an async verifier is awaited even when the tree was cancelled
        return rec

    async def step(self, turn: int) -> NodeStatus | None:
        """One turn: generate a reply, parse its cell, run it, append the observation. Returns the
        node's outcome when this turn ends it."""
        cfg, conv = self.ctx.agent, self.conv
        room = cfg.max_context_tokens - len(conv)
        if room <= 0:
            return NodeStatus.CONTEXT_OVERFLOW
        gen = await self.generate(turn, min(cfg.max_new_tokens, room))
        conv.add_reply(
            gen.token_ids if gen.token_ids is not None else self.ctx.chat.encode(gen.text), gen.logprobs
        )
        self.rec.turns = turn + 1
        if len(conv) >= cfg.max_context_tokens:
            return NodeStatus.CONTEXT_OVERFLOW
        parsed = parse_reply(gen.text, self.ctx.fmt)
        if parsed.code is None:
            observation = parsed.error or ""
        else:
            self.recent = (self.recent + [parsed.code])[-cfg.loop_guard :]
            if len(self.recent) == cfg.loop_guard and len(set(self.recent)) == 1:
                return NodeStatus.LOOP
            assert self.executor is not None
            result = await self.executor.run_cell(
                parsed.code, self.handle, cfg.cell_timeout_s, cfg.max_calls_per_cell
            )
            if self.bug is not None:  # the cell saw an error; the bug goes on up, loudly
                raise self.bug
            if self.finish_message is not None:
                self.rec.finish_message = self.finish_message
                return NodeStatus.FINISHED
            if result.status != "ok":  # the cell timed out or crashed its REPL: the policy's doing
                self.rec.finish_message = result.error or result.status
                return NodeStatus.TIMEOUT if result.status == "timeout" else NodeStatus.ERROR
            observation = truncate(mask_addresses(result.output), cfg.max_observation_chars) or "(no output)"
        self.state.last_observation = observation
        conv.add_observation(self.ctx.chat.observation_ids(observation, conv.ids))
        return None

    async def generate(self, turn: int, max_new_tokens: int) -> Generation:
        """The policy's reply, retried on failure; a policy that keeps failing raises EngineError."""
        ctx = self.ctx
        self.state.turn = turn
        seed = request_seed(ctx.seed, ctx.tree_id, self.path, turn)
        request = GenerationRequest(
            self.conv.ids, max_new_tokens, ctx.fmt.stop, self.state, ctx.temperature, seed
        )
        try:
            return await retrying(ctx.engine_attempts)(ctx.policy.generate, request)
        except Exception as e:
            raise EngineError(f"{type(e).__name__}: {e}") from e

    async def handle(self, name: str, args: list, kwargs: dict) -> Any:
        """Serves the cell's calls: finish, launch_subagent (a child node), and the suite's tools."""
        env, rec = self.env, self.rec
        if name == "finish":
            if self.finish_message is None:
                self.finish_message = str(args[0] if args else kwargs.get("message", ""))
            return "Finished."
        if name == env.launch_tool:
            refusal = self.ctx.budget.reserve_child(rec.depth, rec.children)
            if refusal:
                rec.refused_launches += 1
                return refusal
            try:
                child_env = env.fork(*args, **kwargs)
            except (ValueError, TypeError) as e:  # LaunchError is a ValueError
                self.ctx.budget.release_child()
                return f"Error: {e}"
            rec.children += 1
            try:
                child = await run_node(
                    self.ctx, child_env, f"{self.path}.{rec.children}", rec.depth + 1, rec.node_id
                )
            except Exception as e:  # not the policy's: the REPL would turn it into a cell error
                self.bug = self.bug or e
                raise
            return child.result_for_parent()
        tool = env.tools().get(name)
        if tool is None:
            raise RuntimeError(f"unknown tool {name}")
        if env.shared_state and not is_async(tool):  # forks share state: one call at a time, in order
            async with self.ctx.tool_turns:
                return await self.ctx.executors.call_tool(tool, args, kwargs)
        return await self.ctx.executors.call_tool(tool, args, kwargs)

    def _infra_failure(self, error: InfrastructureError) -> None:
        self.rec.status = NodeStatus.INFRA_ERROR
        self.rec.finish_message = f"{error.kind}: {error}"[:500]
        self.ctx.on_infra_failure(error.kind, self.rec.finish_message)

    async def _finish(self) -> None:
        """Success, tokens and transcript of the ended node; a scorer that raises is an
        infrastructure failure. The record then goes to the tree, with the judge's inputs if the
        suite has no exact verifier for this node."""
        rec, finished = self.rec, self.rec.status == NodeStatus.FINISHED
        rec.ended_at = time.time()
        judge_inputs = None
        try:
            rec.success = await score(self.env, finished, rec.finish_message)
            judge_inputs = self.env.judge_inputs(finished, rec.finish_message)
        except Exception as e:
            rec.success = 0.0
            why = (
                str(e)
                if isinstance(e, ScorerError)
                else f"{scorer_name(self.env)} raised {type(e).__name__}: {e}"
            )
            self._infra_failure(InfrastructureError(why, "scorer"))
            say_first_scorer_failure(rec.node_id, why)
        rec.token_ids, rec.action_mask = self.conv.ids, self.conv.mask
        rec.logprobs = self.conv.stored_logprobs()
        rec.transcript = self.ctx.chat.tokenizer.decode(self.conv.ids)
        self.ctx.on_record(rec, judge_inputs)
