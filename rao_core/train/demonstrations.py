"""The warm start's data: demonstration trees turned into SFT examples, one per successful node
(its token ids; the loss on its own action tokens only). The trees come from the suite's scripted
expert (or a dataset's demonstrator, rao_core/envs/demonstrator.py), run through the Sampler with
the run's tokenizer and chat framing, in the recursive and flat shapes; or from a Parquet of trees
in the nodes schema (warmstart.demonstrations). rao_core/train/warmstart.py trains on them.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rao_core.agent.prompts import ChatFraming
from rao_core.agent.tree import TreeRun, TreeSpec
from rao_core.config import AgentConfig, WarmStartConfig
from rao_core.envs.base import Suite
from rao_core.errors import is_scorer_failure, scorer_is_broken
from rao_core.policy import Policy
from rao_core.sampler import Sampler

MODES = {"recursive": "recursive", "flat": "single"}  # report name -> AgentConfig.mode


def agent_config(suite: Suite, mode: str, context: int) -> AgentConfig:
    """The run's agent budgets (agent.*) in the given shape, at the warm start's context."""
    return dataclasses.replace(suite.ctx.agent, mode=MODES[mode], max_context_tokens=context)


def run_modes(
    jobs: list[tuple[str, TreeSpec]], suite: Suite, policy: Policy, chat: ChatFraming, context: int,
    concurrency: int, temperature: float, on_done: Callable[[TreeRun], None] | None = None,
) -> list[tuple[str, TreeRun]]:  # fmt: skip
    """(mode, tree) jobs through the Sampler, each tree with its mode's budgets; the policy is closed after."""
    mode_of = {id(spec): mode for mode, spec in jobs}
    agent = lambda spec: agent_config(suite, mode_of[id(spec)], context)  # noqa: E731
    sampler = Sampler(policy, chat, agent, suite.ctx.sandbox, None, temperature, concurrency)
    runs = sampler.run([spec for _, spec in jobs], on_tree_done=on_done)
    return [(mode_of[id(run.spec)], run) for run in runs]


# --- data ---------------------------------------------------------------------------------------
def expert_examples(
    cfg: WarmStartConfig, chat: ChatFraming, suite: Suite
) -> tuple[list[dict], dict[str, Any]]:
    """One example per successful node of the suite's expert trees (warmstart.*_episodes of each
    shape); the expert's slips (`mistakes`: node id -> turns) are masked out of the loss. Returns
    the examples and what became of the trees (tree_counts). A scorer that failed at half the nodes
    or more, or trees with no successful node at all, are a one-line ValueError: nothing to learn."""
    expert = suite.demonstrator(cfg)
    if expert is None:
        more = " or warmstart.demonstrator (a function of yours)" if suite.reads_demonstrator() else ""
        raise ValueError(
            f"warmstart.demonstrations: suite {suite.ctx.suite} has no scripted expert: give a Parquet of "
            f"demonstration trees (the nodes schema, e.g. a rollout folder){more}"
        )
    rng = random.Random(f"warmstart:{cfg.seed}")
    jobs = []
    for mode, n in (("recursive", cfg.recursive_episodes), ("flat", cfg.flat_episodes)):
        for i, task in enumerate(suite.demonstration_tasks(cfg, mode, n, rng)):
            jobs.append((mode, TreeSpec(f"ws-{mode}-{i}", 0, suite.env(task), task.difficulty)))
    runs = run_modes(jobs, suite, expert, chat, cfg.context, cfg.max_concurrent_trees, 1.0)
    mistakes = getattr(expert, "mistakes", {})
    rows, kept = [], set()
    for mode, run in runs:
        for r in run.records:
            if r.success < 1 or len(r.token_ids) > cfg.context:
                continue
            mask, slips, turn, prev = list(r.action_mask), mistakes.get(r.node_id, set()), -1, 0
            for i, m in enumerate(r.action_mask):
                turn += m and not prev  # a run of action tokens is one turn
                prev = m
                if m and turn in slips:
                    mask[i] = 0
            rows.append(example(r.token_ids, mask, mode, r.depth))
            kept.add(run.tree_id + mode)
    records = [r for _, run in runs for r in run.records]
    warn_long_replies(records, suite.ctx.agent.max_new_tokens)
    counts = tree_counts(runs, kept, len(rows))
    scorer = [r for r in records if is_scorer_failure(r.status, r.finish_message)]
    if scorer_is_broken(len(scorer), len(records)):
        raise ValueError(
            f"warm start: the suite's scorer failed at {len(scorer)} of {len(records)} nodes of the expert's "
            f"trees, as at node {scorer[0].node_id}: {scorer[0].finish_message.removeprefix('scorer: ')} "
            "(`rao train --check` scores the suite in seconds)"
        )
    if not rows:
        raise ValueError(
            f"warm start: none of the {len(runs)} demonstration trees has a node that succeeded (the roots "
            f"ended: {counts['dropped_by']}): nothing to learn from; `rao train --check` runs one per difficulty"
        )
    return rows, counts


def tree_counts(runs: list[tuple[str, TreeRun]], kept: set[str], examples: int) -> dict[str, Any]:
    """Trees made, kept (a node of theirs is an example) and dropped, by how their roots ended."""
    dropped: Counter[str] = Counter()
    for mode, run in runs:
        if run.tree_id + mode not in kept:
            root = next(r for r in run.records if r.parent_id is None)
            dropped["finished below 1" if root.status == "finished" else str(root.status)] += 1
    by = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none"
    return {"made": len(runs), "kept": len(kept), "dropped": sum(dropped.values()), "dropped_by": by,
            "examples": examples}  # fmt: skip


def reply_lengths(action_mask: list[int]) -> list[int]:
    """The length of each reply in a node's tokens (each run of action tokens is one reply)."""
    lengths, run = [], 0
    for m in [*action_mask, 0]:
        if m:
            run += 1
        elif run:
            lengths, run = [*lengths, run], 0
    return lengths


def warn_long_replies(records: list, max_new_tokens: int) -> str | None:
    """The expert writes whole cells, but a model samples at most agent.max_new_tokens a turn: a
    model trained on longer cells is cut mid-cell at rollout. Says so (log and return), or None."""
    lengths = [n for r in records for n in reply_lengths(r.action_mask)]
    long = [n for n in lengths if n > max_new_tokens]
    if not long:
        return None
    line = (
        f"warm start: {len(long)} of {len(lengths)} expert replies are longer than agent.max_new_tokens="
        f"{max_new_tokens} (the longest: {max(long)} tokens); a model trained on them is cut mid-cell at "
        f"rollout: raise agent.max_new_tokens to at least {max(long)} (docs/own-task.md, 'Sizing your task')"
    )
    print(f"WARNING: {line}", flush=True)
    return line


def example(token_ids: list[int], mask: list[int], mode: str, depth: int) -> dict:
    return {"input_ids": list(token_ids), "assistant_masks": list(mask), "mode": mode, "depth": depth,
            "bucket": (mode == "recursive") * 1_000_000 + len(token_ids)}  # fmt: skip


def demonstration_examples(cfg: WarmStartConfig, vocab_size: int) -> list[dict]:
    """One example per successful node of a Parquet of trees in the nodes schema (a file, or a
    folder of them such as <run>/rollouts/round=0): its token ids must be the model's tokenizer's."""
    import pyarrow.dataset as ds

    source = Path(cfg.demonstrations)
    if not source.exists():
        raise ValueError(f"warmstart.demonstrations: {cfg.demonstrations!r}: no such file or folder")
    columns = ["token_ids", "action_mask", "success", "depth", "mode"]
    table = ds.dataset(source, format="parquet").to_table(columns=columns)
    rows = []
    for r in table.to_pylist():
        if r["success"] < 1 or len(r["token_ids"]) > cfg.context:
            continue
        if max(r["token_ids"], default=0) >= vocab_size:
            raise ValueError(
                f"warmstart.demonstrations: token id {max(r['token_ids'])} >= the tokenizer's {vocab_size}: "
                "the trees were tokenized by another tokenizer (set policy.tokenizer when rolling them out)"
            )
        mode = "flat" if r["mode"] == "single" else "recursive"
        rows.append(example(r["token_ids"], r["action_mask"], mode, r["depth"]))
    if not rows:
        raise ValueError(
            f"warmstart.demonstrations: {cfg.demonstrations!r}: no successful node to learn from"
        )
    return rows
