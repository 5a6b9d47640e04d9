"""What the stages share: the stage marker, shards of a partition, and sampling a draw of trees
into a partition (the Sampler with the run's policy, chat framing, sandbox and judge). Resume
(the run folder's saved configuration) is the synthesize stage's: it runs first."""

from __future__ import annotations

import itertools
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rao_core import interrupts, runlock
from rao_core.agent.prompts import ChatFraming
from rao_core.config import AgentConfig
from rao_core.engines.open import open_judge_engine, open_policy_engine
from rao_core.envs.suites import open_suite
from rao_core.judges import build_judge
from rao_core.models.tokenizer import load_tokenizer
from rao_core.policy import Policy
from rao_core.run import Run
from rao_core.sampler import Draw, RowLabels, Sampler, draw_trees
from rao_core.store.parquet import clean_temporaries, is_complete, read_meta, seal_partition
from rao_core.verdicts import Judge


def note(run: Run, what: str) -> None:
    """Say which stage the run folder's writer is at (`rao status`, a refused second writer)."""
    runlock.note_stage(run.dir, what)
    interrupts.check()  # a signal whose exception a finalizer dropped ends the command here


# -- shards ------------------------------------------------------------------------------------
def shard_dir(dest: Path, shard: int, shards: int) -> Path:
    """Shard K's partition of `dest` (a round, or an evaluated version): `dest/shard=K/`, or `dest`
    itself when there is one shard (so `shards = 1` keeps the unsharded layout)."""
    return dest if shards == 1 else dest / f"shard={shard}"


def run_sharded(dest: Path, shards: int, what: str, run_shard: Callable[[int], Path]) -> Path:
    """The partition `dest` as `shards` shards (a round, or an evaluated version): unless it is
    complete, run every shard (each a no-op when complete) in turn, then seal it. A Ray cluster
    runs the shards in parallel first (flows/training.py); a complete shard is never rerun."""
    if not is_complete(dest):
        check_shard_count(dest, shards, what)
        for k in range(shards):
            run_shard(k)
    return seal_shards(dest, shards)


def check_shard_count(dest: Path, shards: int, what: str) -> None:
    """A partition started with S shards is finished with S: its complete shards hold the tasks
    dealt k::S, and another count would deal the rest differently (duplicated and missing tasks)."""
    for part in dest.glob("shard=*"):
        if is_complete(part):
            started = read_meta(part).get("shard", [0, shards])[1]
            if started != shards:
                raise ValueError(
                    f"rollout.shards: {shards}: {what} was started with {started} shards; finish it "
                    f"with rollout.shards={started} (a new count applies from the next round)"
                )


def node_name() -> str:
    """Where this process runs: the host, and the Ray node when a Ray worker runs it (the nodes
    of a cluster simulated on one host share the host name)."""
    ray = sys.modules.get("ray")  # never imported for this: a Ray worker has it
    if ray is not None and ray.is_initialized():
        return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:12]}"
    return socket.gethostname()


def seal_shards(dest: Path, shards: int) -> Path:
    """Mark a sharded partition complete once every shard is (a no-op for one shard or a sealed
    partition): from then on readers see the shards as one table."""
    if shards == 1 or is_complete(dest):
        return dest
    parts = [shard_dir(dest, k, shards).name for k in range(shards)]
    metas = [read_meta(dest / p) for p in parts if is_complete(dest / p)]
    meta = {  # the partition's wall time is its slowest shard's
        "trees": sum(m.get("trees", 0) for m in metas),
        "seconds": max((m.get("seconds", 0.0) for m in metas), default=0.0),
        "nodes": [m.get("node", "") for m in metas],  # where each shard ran, in shard order
    }
    return seal_partition(dest, parts, meta)


# -- sampling ----------------------------------------------------------------------------------
def open_policy(run: Run, suite, version: int, context: int, role: str = "policy") -> tuple[Policy, Any]:
    """The policy of version `version`: the suite's scripted expert (policy.kind=scripted), or an
    engine serving that checkpoint (on the engine processes of `role`); with the tokenizer that
    frames the conversation."""
    cfg = run.config
    if cfg.policy.kind == "scripted":
        expert = suite.expert()
        if expert is None:
            raise ValueError(f"policy.kind: 'scripted': suite {cfg.suite} has no scripted expert")
        return expert, load_tokenizer("tiny" if cfg.policy.tokenizer == "auto" else cfg.policy.tokenizer)
    lora_rank = cfg.train.lora_r if cfg.train.lora else 0
    return open_policy_engine(
        cfg.policy, run.checkpoints.path(version), context, lora_rank, cfg.rollout.runner == "ray", role,
        overlap=cfg.campaign.max_staleness > 0,
    )  # fmt: skip


def open_judge(run: Run) -> Judge | None:
    """The run's judge (judge.*), handed its engine; None for judge.kind=none."""
    return build_judge(run.config.judge, run.dir, open_judge_engine(run.config.judge))


def sample(
    run: Run, dest: Path, draw: Draw, version: int, agent: AgentConfig | None = None, progress: bool = False,
    round_: int | None = None, role: str = "policy",
) -> Path:  # fmt: skip
    """Draw the trees, run them with policy version `version` (agent.* or `agent`), write their
    rows as the partition `dest`, labelled with round `round_` (default: the version; round r
    samples with version max(0, r - campaign.max_staleness), an evaluation of version v carries v
    in both). `role` names the engine processes that serve it (engines/scope.py). Idempotent: a
    complete partition is returned as it is, an incomplete one is rewritten whole."""
    if is_complete(dest):
        return dest
    clean_temporaries(dest.parent, dest.name)  # only its own: sibling shards may be writing
    cfg = run.config
    agent = agent or cfg.agent
    suite = open_suite(cfg)
    specs = draw_trees(suite, draw)
    policy, tokenizer = open_policy(run, suite, version, agent.max_context_tokens, role)
    sampler = Sampler(
        policy, ChatFraming(tokenizer, cfg.policy.chat_template_kwargs), agent, cfg.sandbox, open_judge(run),
        draw.temperature, cfg.rollout.max_concurrent_trees, cfg.policy.retries,
    )  # fmt: skip
    round_ = version if round_ is None else round_
    labels = RowLabels(run.name, round_, draw.split, agent.mode, cfg.suite, version)
    done = itertools.count(1)

    def tree_done(_: Any) -> None:  # how far the stage is, for `rao status`
        runlock.note_progress(run.dir, f"{next(done)} of {len(specs)} trees")

    meta = {"shard": list(draw.shard), "node": node_name()}
    return sampler.sample(specs, labels, dest, meta, progress, tree_done)
