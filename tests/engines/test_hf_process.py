"""The transformers engine in child processes (rao_core/engines/hf_process.py): the same tokens and
log-probs as HFEngine in process (greedy and seeded sampling, fp32 and bf16 checkpoints, one child
or two replicas), weight reloads, a node's turns on one replica, cancellation, a dead child and a
bad checkpoint as clear errors, and children that live as long as their EngineScope."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch

from rao_core.engines import build_engine, engine_processes
from rao_core.engines.hf import HFEngine
from rao_core.engines.hf_process import EngineProcess, EngineSpec, ProcessEngine, ReplicatedEngine
from rao_core.engines.scope import engine_scope
from rao_core.models.tiny import save_checkpoint
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.policy import Generation, GenerationRequest, NodeState, Policy
from rao_core.run import Run, load_config
from tests.engines import req, small_model

TOK = tiny_tokenizer()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Two fp32 checkpoints of different weights and a bf16 one, as users save them."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, seed, dtype in [("a", 0, torch.float32), ("b", 1, torch.float32), ("bf16", 2, torch.bfloat16)]:
        out[name] = root / name
        save_checkpoint(small_model(TOK, seed=seed).to(dtype), TOK, out[name])
    return out


@pytest.fixture(scope="module")
def children():
    """Two engine processes for the whole module (a child's start is seconds of imports)."""
    procs = [EngineProcess(), EngineProcess()]
    yield procs
    for p in procs:
        p.stop()


def requests() -> list[GenerationRequest]:
    """Greedy and seeded T = 1 requests over prompts of different lengths."""
    ps = [[3 + (7 * i + j) % 90 for j in range(5 + 9 * i)] for i in range(8)]
    out = [req(p, 12) for p in ps[:4]]
    for i, p in enumerate(ps[4:]):
        r = req(p, 12, temperature=1.0)
        r.seed = 100 + i
        out.append(r)
    return out


def generate_all(policy: Policy, reqs: list[GenerationRequest]) -> list[Generation]:
    async def main():
        return await asyncio.gather(*[policy.generate(r) for r in reqs])

    return asyncio.run(main())


def load(procs: list[EngineProcess], path: Path) -> list[ProcessEngine]:
    spec = EngineSpec(str(path), TOK)
    for p, fut in [(p, p.load(spec)) for p in procs]:
        p.device = fut.result()
    return [ProcessEngine(spec, p, owned=False) for p in procs]


def assert_same(got: list[Generation], want: list[Generation], tol: float = 1e-5) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=tol)


@pytest.mark.parametrize("name", ["a", "bf16"])
def test_child_and_replicas_match_the_engine_in_process(checkpoints, children, name):
    reqs = requests()
    want = generate_all(HFEngine.from_pretrained(checkpoints[name], TOK), reqs)
    engines = load(children, checkpoints[name])
    # a bf16 checkpoint is served in bf16 where the CPU has bf16 units (models/dtypes.py): batches of
    # other shapes round its log-probs differently (bf16's step at |logit| 4-8 is 0.03; 7.8e-3
    # seen); the tokens stay the same
    tol = 1e-5 if name == "a" else 2e-2
    assert_same(generate_all(engines[0], reqs), want, tol)
    replicated = ReplicatedEngine(engines)
    assert_same(generate_all(replicated, reqs), want, tol)
    assert sum(e.stats.requests for e in engines) == 2 * len(reqs)  # the child kept its engine's stats


def test_a_load_swaps_the_weights(checkpoints, children):
    reqs = requests()[:4]
    for name in ["a", "b", "a"]:
        (engine, _) = load(children, checkpoints[name])
        assert_same(
            generate_all(engine, reqs), generate_all(HFEngine.from_pretrained(checkpoints[name], TOK), reqs)
        )


def test_bad_checkpoint_is_a_clear_error_and_the_child_lives_on(checkpoints, children, tmp_path):
    with pytest.raises(RuntimeError, match="loading .*missing"):
        children[0].load(EngineSpec(str(tmp_path / "missing"), TOK)).result()
    with pytest.raises(RuntimeError, match="no model loaded"):
        generate_all(ProcessEngine(EngineSpec("missing", TOK), children[0], owned=False), requests()[:1])
    (engine, _) = load(children, checkpoints["a"])
    assert generate_all(engine, requests()[:1])[0].token_ids


def test_a_cancelled_request_leaves_the_engine_serving(checkpoints, children):
    (engine, _) = load(children, checkpoints["a"])
    long = req([5, 6, 7], 4000, temperature=1.0)

    async def main():
        try:  # cancelled in flight (unless eos came first): the child drops it, answers nothing
            await asyncio.wait_for(engine.generate(long), 0.05)
        except TimeoutError:
            pass
        return await engine.generate(req([5, 6, 7], 5))

    assert len(asyncio.run(main()).token_ids) == 5


def test_replicas_keep_each_node_where_it_started():
    class Recorder(Policy):
        def __init__(self) -> None:
            self.nodes: list[str] = []

        async def generate(self, request):
            self.nodes.append(request.node.node_id)
            await asyncio.sleep(0.001)
            return Generation("x", [1], [0.0])

    def node(i: int) -> NodeState:
        return NodeState(f"t{i}:0", 0, 2, True, None)  # type: ignore[arg-type]

    replicas = [Recorder(), Recorder()]
    engine = ReplicatedEngine(replicas)

    async def turns(i: int):
        for _ in range(3):
            r = req([1, 2], 1)
            r.node = node(i)
            await engine.generate(r)

    async def main():
        await asyncio.gather(*[turns(i) for i in range(10)])

    asyncio.run(main())
    a, b = (set(r.nodes) for r in replicas)
    assert a and b and not a & b  # both used, every node on one
    assert sorted(len([n for n in r.nodes if n == x]) for r in replicas for x in set(r.nodes)) == [3] * 10


def test_a_dead_child_fails_its_requests_and_the_scope_starts_another(checkpoints):
    cfg = load_config(None, [f"policy.model={checkpoints['a']}", "policy.engine_processes=1"])
    with engine_scope() as scope:
        engine = build_engine(cfg.policy, TOK)
        (proc,) = scope.hf_processes.values()
        os.kill(proc.process.pid, signal.SIGKILL)
        proc.process.wait()
        with pytest.raises(RuntimeError, match="hf engine process"):
            generate_all(engine, requests()[:1])
        again = build_engine(cfg.policy, TOK)  # a new child in place of the dead one
        (fresh,) = scope.hf_processes.values()
        assert fresh is not proc and generate_all(again, requests()[:1])[0].token_ids
    assert fresh.process.poll() is not None  # the scope's end stopped it


def test_engine_processes_auto():
    cfg = load_config(None, ["policy.device=cpu"]).policy
    cores = len(os.sched_getaffinity(0))
    assert engine_processes(cfg) == (min(cores, 4) if cores > 1 else 0)
    assert engine_processes(load_config(None, ["policy.engine_processes=3"]).policy) == 3
    with pytest.raises(ValueError, match="engine_processes"):
        load_config(None, ["policy.engine_processes=-1"])


def test_ray_shards_are_the_replicas(checkpoints, tmp_path):
    """Under rollout.runner=ray each shard's engine is one HFEngine in its worker (auto -> 0)."""
    from rao_core.envs.suites import open_suite
    from rao_core.stages.common import open_policy

    # open_suite synthesizes the run's task split: into tmp_path, not the checkout's runs/
    cfg = load_config(
        None, [f"runs_dir={tmp_path}", f"policy.model={checkpoints['a']}", "rollout.runner=ray"]
    )
    engine, _ = open_policy(Run(cfg), open_suite(cfg), 0, cfg.agent.max_context_tokens)
    assert isinstance(engine, HFEngine)
    asyncio.run(engine.close())


def test_a_campaign_scope_starts_its_children_at_once(checkpoints, tmp_path):
    """campaign.engines starts the children when it opens; the stages' engines are those."""
    from rao_core.campaign import engines

    cfg = load_config(
        None, [f"runs_dir={tmp_path}", f"policy.model={checkpoints['a']}", "policy.engine_processes=2"]
    )
    with engines(Run(cfg)) as scope:
        started = dict(scope.hf_processes)
        assert len(started) == 2 and all(p.alive() for p in started.values())
        engine = build_engine(cfg.policy, TOK)
        assert isinstance(engine, ReplicatedEngine) and scope.hf_processes == started
        assert_same(
            generate_all(engine, requests()),
            generate_all(HFEngine.from_pretrained(checkpoints["a"], TOK), requests()),
        )
    assert all(p.process.poll() is not None for p in started.values())


def test_closing_a_scope_engine_unloads_its_model(checkpoints, children):
    """A stage's engine on a scope's child unloads the model when it closes (the child idles small
    while the trainer runs); the next load serves again."""
    (engine, _) = load(children, checkpoints["a"])
    asyncio.run(engine.close())
    assert children[0].alive()
    with pytest.raises(RuntimeError, match="no model loaded"):
        generate_all(engine, requests()[:1])
    (engine, _) = load(children, checkpoints["a"])
    assert generate_all(engine, requests()[:1])[0].token_ids
