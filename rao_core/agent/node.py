"""One agent instance: the turn loop of a node.

Each turn: ask the policy for a reply, append its tokens (mask 1), run the cell in the node's own
sandboxed REPL, append the observation's tokens (mask 0). The node ends on finish(), on a budget
(steps, context), on a repeated cell (loop guard), on a cell timeout or a dead REPL, or when the
tree is cancelled. The record is written in every case.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rao_core.agent.parsing import parse_reply
from rao_core.agent.policy import GenerationRequest, NodeState
from rao_core.agent.prompts import system_prompt, truncate, user_prompt
from rao_core.agent.sandbox import Sandbox

if TYPE_CHECKING:
    from rao_core.agent.tree import TreeRun
    from rao_core.envs.base import Environment


@dataclass
class NodeRecord:
    node_id: str
    parent_id: str | None
    depth: int
    goal: str
    targets: str
    status: str = "error"
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
        context_chars=env.context_chars(),
    )
    recursive = tree.recursive
    state = NodeState(rec.node_id, depth, cfg.max_depth, recursive, env, rng=tree.node_rng(path))
    finish_message: list[str] = []
    sandbox: Sandbox | None = None
    child_count = 0

    async def handle(name: str, args: list, kwargs: dict) -> Any:
        nonlocal child_count
        if name == "finish":
            message = args[0] if args else kwargs.get("message", "")
            finish_message.append(str(message))
            return "Finished."
        if name == env.launch_tool:
            refusal = tree.reserve_child(depth, child_count)
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
            child = await run_node(tree, child_env, f"{path}.{child_count}", depth + 1, rec.node_id)
            return child.result_for_parent()
        tool = env.tools().get(name)
        if tool is None:
            raise RuntimeError(f"unknown tool {name}")
        return tool(*args, **kwargs)

    ids = chat.initial_ids(system_prompt(env, tree.fmt, cfg, recursive), user_prompt(env, depth, cfg))
    mask = [0] * len(ids)
    logprobs: list[float] = []
    recent: list[str] = []
    try:
        launch = [env.launch_tool] if recursive else []
        sandbox = await Sandbox.start(
            sync_tools=[*env.tools(), "finish", *([] if env.launch_async else launch)],
            async_tools=launch if env.launch_async else [],
            limits=tree.sandbox_cfg,
            variables=env.repl_variables(),
            echo=env.repl_echo,
        )
        rec.status = "budget"
        for turn in range(cfg.max_steps):
            room = cfg.max_context_tokens - len(ids)
            if room <= 0:
                rec.status = "context_overflow"
                break
            state.turn = turn
            req = GenerationRequest(
                ids, min(cfg.max_new_tokens, room), tree.fmt.stop, state, tree.temperature
            )
            gen = await tree.policy.generate(req)
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
                if result.status != "ok":
                    rec.status = "timeout" if result.status == "timeout" else "error"
                    rec.finish_message = result.error or result.status
                    break
                observation = truncate(result.output, cfg.max_observation_chars) or "(no output)"
            state.last_observation = observation
            obs_ids = chat.observation_ids(observation)
            ids, mask = ids + obs_ids, mask + [0] * len(obs_ids)
    except asyncio.CancelledError:
        rec.status, rec.finish_message = "timeout", "tree wall-clock budget exhausted"
        raise
    except Exception as e:  # a broken tool or environment ends this node only
        rec.status, rec.finish_message = "error", f"{type(e).__name__}: {e}"[:500]
    finally:
        if sandbox is not None:
            await asyncio.shield(sandbox.close())
        rec.ended_at = time.time()
        try:  # a broken suite scorer costs this node its success, never its row
            rec.success = float(env.success(rec.status == "finished", rec.finish_message))
            inputs = env.judge_inputs(rec.status == "finished", rec.finish_message)
            if inputs is not None:  # no exact verifier: a judge (or the root proxy) decides, later
                tree.judge_later(rec, inputs)
        except Exception as e:
            rec.success, rec.status = 0.0, "error"
            rec.finish_message = f"scoring failed: {type(e).__name__}: {e}"[:500]
        rec.token_ids, rec.action_mask = ids, mask
        if logprobs:
            rec.logprobs = logprobs + [0.0] * (len(ids) - len(logprobs))
        rec.transcript = chat.tokenizer.decode(ids)
        tree.records.append(rec)
    return rec
