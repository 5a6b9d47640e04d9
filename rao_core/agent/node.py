"""One agent instance: the turn loop of a node.

Each turn: ask the policy for a reply, append its tokens (mask 1), run the cell in the node's own
sandboxed REPL, append the observation's tokens (mask 0). The node ends on finish(), on a budget
(steps, context), on a repeated cell (loop guard), on a cell timeout or a crashed REPL, or when the
tree is cancelled. Those are the policy's outcomes. A component that fails (the engine after its
retries, a REPL worker that cannot start, a scorer that raises) ends the node as `infra_error`
instead, and its tree is left out of training (rao_core/errors.py). The record is written in
every case.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rao_core.agent.parsing import parse_reply
from rao_core.agent.policy import Generation, GenerationRequest, NodeState
from rao_core.agent.prompts import mask_addresses, system_prompt, truncate, user_prompt
from rao_core.agent.sandbox import Sandbox
from rao_core.errors import EngineError, InfrastructureError, SandboxStartError, retrying

if TYPE_CHECKING:
    from rao_core.agent.tree import TreeRun
    from rao_core.envs.base import Environment

SANDBOX_START_ATTEMPTS = 3


@dataclass
class NodeRecord:
    node_id: str
    parent_id: str | None
    depth: int
    goal: str
    targets: str
    temperature: float = 1.0  # what the node's actions were sampled at (its log-probs are at it)
    status: str = "infra_error"  # until the node reaches an outcome of its own
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
        if self.status == "finished":
            return self.finish_message
        reasons = {
            "budget": "did not finish before its step budget",
            "context_overflow": "ran out of context before finishing",
            "loop": "repeated the same cell and was stopped",
            "timeout": "ran out of time before finishing",
        }
        return f"Sub-agent failed: {reasons.get(self.status, 'failed before finishing')}."


def request_seed(tree_seed: int, tree_id: str, path: str, turn: int) -> int:
    """The seed of one sampling request: a function of (seed, tree, node, turn) only, so a rerun
    samples the same tokens whatever else shares the batch and whenever it arrives."""
    digest = hashlib.sha256(f"{tree_seed}|{tree_id}|{path}|{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: fits every engine's seed type


async def generate(tree: TreeRun, request: GenerationRequest) -> Generation:
    """The policy's reply, retried on failure; a policy that keeps failing raises EngineError."""
    try:
        return await retrying(tree.engine_attempts)(tree.policy.generate, request)
    except Exception as e:
        raise EngineError(f"{type(e).__name__}: {e}") from e


async def start_sandbox(tree: TreeRun, env: Environment) -> Sandbox:
    """The node's REPL worker, retried; one that cannot start raises SandboxStartError."""
    launch = [env.launch_tool] if tree.recursive else []
    try:
        return await retrying(SANDBOX_START_ATTEMPTS)(
            Sandbox.start,
            sync_tools=[*env.tools(), "finish", *([] if env.launch_async else launch)],
            async_tools=launch if env.launch_async else [],
            limits=tree.sandbox_cfg,
            variables=env.repl_variables(),
            echo=env.repl_echo,
        )
    except Exception as e:
        raise SandboxStartError(f"{type(e).__name__}: {e}") from e


def _tool_handler(tree: TreeRun, env: Environment, rec: NodeRecord, path: str, finish_message: list[str]):
    """Serves the cell's calls: finish, launch_subagent (a child node), and the suite's tools."""
    child_count = 0

    async def handle(name: str, args: list, kwargs: dict) -> Any:
        nonlocal child_count
        if name == "finish":
            message = args[0] if args else kwargs.get("message", "")
            finish_message.append(str(message))
            return "Finished."
        if name == env.launch_tool:
            refusal = tree.reserve_child(rec.depth, child_count)
            if refusal:
                rec.refused_launches += 1
                return refusal
            try:
                child_env = env.fork(*args, **kwargs)
            except (ValueError, TypeError) as e:  # LaunchError is a ValueError
                tree.release_child()
                return f"Error: {e}"
            child_count += 1
            rec.children = child_count
            child = await run_node(tree, child_env, f"{path}.{child_count}", rec.depth + 1, rec.node_id)
            return child.result_for_parent()
        tool = env.tools().get(name)
        if tool is None:
            raise RuntimeError(f"unknown tool {name}")
        return tool(*args, **kwargs)

    return handle


async def run_node(
    tree: TreeRun, env: Environment, path: str, depth: int, parent_id: str | None
) -> NodeRecord:
    cfg, chat = tree.agent_cfg, tree.chat
    rec = NodeRecord(
        node_id=f"{tree.tree_id}:{path}",
        parent_id=parent_id,
        depth=depth,
        goal=env.goal_text(),
        targets=json.dumps(env.targets(), sort_keys=True),
        temperature=tree.temperature,
        context_chars=env.context_chars(),
    )
    state = NodeState(rec.node_id, depth, cfg.max_depth, tree.recursive, env, rng=tree.node_rng(path))
    finish_message: list[str] = []
    handle = _tool_handler(tree, env, rec, path, finish_message)
    ids = chat.initial_ids(system_prompt(env, tree.fmt, cfg, tree.recursive), user_prompt(env, depth, cfg))
    mask, logprobs = [0] * len(ids), []
    recent: list[str] = []
    sandbox: Sandbox | None = None
    try:
        sandbox = await start_sandbox(tree, env)
        rec.status = "budget"
        for turn in range(cfg.max_steps):
            room = cfg.max_context_tokens - len(ids)
            if room <= 0:
                rec.status = "context_overflow"
                break
            state.turn = turn
            seed = request_seed(tree.spec.seed, tree.tree_id, path, turn)
            req = GenerationRequest(
                ids, min(cfg.max_new_tokens, room), tree.fmt.stop, state, tree.temperature, seed
            )
            gen = await generate(tree, req)
            new_ids = gen.token_ids if gen.token_ids is not None else chat.encode(gen.text)
            ids, mask = ids + new_ids, mask + [1] * len(new_ids)
            if gen.logprobs is not None:
                logprobs += [0.0] * (len(ids) - len(new_ids) - len(logprobs)) + list(gen.logprobs)
            rec.turns = turn + 1
            if len(ids) >= cfg.max_context_tokens:
                rec.status = "context_overflow"
                break
            parsed = parse_reply(gen.text, tree.fmt)
            if parsed.code is None:
                observation = parsed.error or ""
            else:
                recent = (recent + [parsed.code])[-cfg.loop_guard :]
                if len(recent) == cfg.loop_guard and len(set(recent)) == 1:
                    rec.status = "loop"
                    break
                result = await sandbox.run_cell(
                    parsed.code, handle, cfg.cell_timeout_s, cfg.max_calls_per_cell
                )
                if finish_message:
                    rec.status, rec.finish_message = "finished", finish_message[0]
                    break
                if result.status != "ok":  # the cell timed out or crashed its REPL: the policy's doing
                    rec.status = "timeout" if result.status == "timeout" else "error"
                    rec.finish_message = result.error or result.status
                    break
                observation = (
                    truncate(mask_addresses(result.output), cfg.max_observation_chars) or "(no output)"
                )
            state.last_observation = observation
            obs_ids = chat.observation_ids(observation, ids)
            ids, mask = ids + obs_ids, mask + [0] * len(obs_ids)
    except asyncio.CancelledError:
        rec.status, rec.finish_message = "timeout", "tree wall-clock budget exhausted"
        raise
    except Exception as e:  # a component failed (or a bug): never the policy's fault
        _infra_failure(tree, rec, e)
    finally:
        if sandbox is not None:
            await asyncio.shield(sandbox.close())
        _finish_record(tree, env, rec, ids, mask, logprobs)
    return rec


def _infra_failure(tree: TreeRun, rec: NodeRecord, error: Exception) -> None:
    kind = error.kind if isinstance(error, InfrastructureError) else "internal"
    rec.status = "infra_error"
    rec.finish_message = f"{kind}: {error}"[:500]
    tree.infra_failure(kind, rec.finish_message)


def _finish_record(
    tree: TreeRun, env: Environment, rec: NodeRecord, ids: list[int], mask: list[int], logprobs: list[float]
) -> None:
    """Success, tokens and transcript of an ended node; a broken scorer is an infrastructure failure."""
    rec.ended_at = time.time()
    try:
        rec.success = float(env.success(rec.status == "finished", rec.finish_message))
        inputs = env.judge_inputs(rec.status == "finished", rec.finish_message)
        if inputs is not None:  # no exact verifier: a judge (or the root proxy) decides, later
            tree.judge_later(rec, inputs)
    except Exception as e:
        rec.success = 0.0
        _infra_failure(tree, rec, InfrastructureError(f"scoring failed: {type(e).__name__}: {e}", "scorer"))
    rec.token_ids, rec.action_mask = ids, mask
    if logprobs:
        rec.logprobs = logprobs + [0.0] * (len(ids) - len(logprobs))
    rec.transcript = tree.chat.tokenizer.decode(ids)
    tree.records.append(rec)
