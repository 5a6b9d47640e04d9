"""Benchmark: the default rollout round against the bare model forward it needs.

(a) rollout: round 0 of issue 25's configuration (`rao rollout --set policy.model=small-inline-root`:
    8 tasks x 12 trees, seed 0; change it with --set), its engines as configured (`policy.engine_processes`,
    auto: one child process per core, here 2), timed from the first tree to the last on engine
    processes already started (a campaign starts them once, at its first round);
(a0) the same round with one engine in process (`policy.engine_processes=0`), every forward it makes
    recorded (tokens, positions, slots, columns); its trees are checked, token for token, against (a);
(b) forward-only: (a0)'s forwards, in the same order and shapes, replayed through the same model
    and attention into preallocated slots on one core, and nothing else: no admission, sampling,
    stop checks, K/V reuse bookkeeping, cells or asyncio. That is the limit of one engine of this
    design on this model.

(c) with --ray-shards S: the same round as S engine replicas in parallel, one Ray task each,
    through the `rao-rollout` flow (`rollout.runner=ray`, `rollout.shards=S`: both cores of this
    machine at S = 2), run twice in one Ray session as a campaign does: the first pass pays the
    workers' start (once per campaign), the second is what every later round costs. Its trees are
    checked, token for token, against (a).

Prints them, `rollout / forward-only` and `in process / rollout`. The round's trees are the same at
every concurrency and engine count (the sampling is seeded per node), so
`--set rollout.max_concurrent_trees=16` times today's schedule.

    .venv/bin/python bench/rollout_bench.py [--set rollout.max_concurrent_trees=16] [--ray-shards 2] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rao_core import interrupts
from rao_core.campaign import engines
from rao_core.config import RunConfig
from rao_core.engines import engine_processes
from rao_core.engines.hf import HFEngine
from rao_core.engines.hf_static import StaticDecode, column_bucket
from rao_core.engines.kv_slots import KVSlots, KVSpec, forward_in_slots
from rao_core.envs.suites import open_suite
from rao_core.eval.metrics import load_round, summarize
from rao_core.run import Run, load_config
from rao_core.stages.common import open_policy
from rao_core.stages.rollout import roll_out
from rao_core.stages.synthesize import synthesize

# The round issue 25 timed: the main job's version 0 then (the default is small-warmstart-7500 now,
# whose trees are larger, so its round is not the one the figures in docs/engines.md compare).
MODEL = "small-inline-root"


def record_forwards() -> tuple[list[tuple], list, Callable[[], None]]:
    """Patch HFEngine._forward (prefills, and the runs path's decode steps) and StaticDecode.step
    (the static path's decode steps, replayed unpadded over the same columns) to keep (ids,
    positions, first slot, write columns, runs) per call; returns the calls, [the first engine
    seen] and the function that stops recording."""
    calls, seen = [], []
    original, original_static = HFEngine._forward, StaticDecode.step

    def recording(self, ids, pos, slots):
        calls.append((ids.clone(), pos.clone(), slots._first, slots._write_cols.clone(), slots.runs))
        if not seen:
            seen.append(self)
        return original(self, ids, pos, slots)

    def recording_static(self, batch, rows):
        pos = batch.slots.lens[:rows, None].clone()
        columns = column_bucket(int(batch.slots.filled.max()) + 1)
        calls.append((batch.last[:rows, None].clone(), pos, 0, pos, [(0, rows, columns)]))
        return original_static(self, batch, rows)

    def stop() -> None:
        HFEngine._forward, StaticDecode.step = original, original_static

    HFEngine._forward, StaticDecode.step = recording, recording_static
    return calls, seen, stop


def peak_gib(pid: int | str, field: str = "VmHWM") -> float:
    """A process's peak resident memory (VmHWM; VmRSS: now), in GiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


@torch.inference_mode()
def replay(model, calls: list[tuple]) -> float:
    """Seconds to run the recorded forwards through the model alone (the mask each plan builds
    included), one intra-op thread as in the engine's worker thread."""
    torch.set_num_threads(1)
    device = next(model.parameters()).device
    slots = KVSlots(device, KVSpec.of(model))
    slots.reserve(
        max(first + ids.shape[0] for ids, _, first, *_ in calls),
        max(max(int(c[1].max()) + 1, *(n for *_, n in c[4])) for c in calls),
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    sync()
    start = time.perf_counter()
    for ids, pos, first, cols, runs in calls:
        # the recorded scratch column may sit elsewhere; each decode step's columns as recorded
        slots.plan(first, cols.clamp(max=slots.cols), pos, runs, length=max(n for *_, n in runs))
        forward_in_slots(model, ids, pos, slots)
    sync()
    return time.perf_counter() - start


def tokens(cfg) -> list[tuple]:
    """The round's nodes, in a fixed order, as what they sampled."""
    rows = load_round(cfg.layout, 0).select(["task_id", "sample", "node_id", "token_ids"]).to_pylist()
    return sorted(tuple(r.values()) for r in rows)


def ray_passes(overrides: list[str], shards: int) -> tuple[list[float], RunConfig]:
    """Seconds of two passes of the round as `shards` Ray tasks through the flow, in one Ray
    session and one parent flow run (so one Prefect API server, as in `rao train`), and the config
    of the second pass."""
    from prefect import flow

    from flows.cli import _prefect_env
    from flows.training import ray_session, rollout_flow

    _prefect_env()
    ray = ["rollout.runner=ray", f"rollout.shards={shards}"]
    cfgs = {name: [*overrides, *ray, f"run_name={name}"] for name in ("ray-first", "ray-warm")}

    @flow(name="rollout-bench")
    def passes() -> list[float]:
        seconds = []
        with ray_session(Run.load(None, cfgs["ray-first"])):
            for over in cfgs.values():
                start = time.perf_counter()
                rollout_flow(overrides=over)
                seconds.append(time.perf_counter() - start)
        return seconds

    return passes(), load_config(None, cfgs["ray-warm"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--runs-dir", default=None, help="where the round is written (default: a temporary folder)"
    )
    ap.add_argument("--ray-shards", type=int, default=0, help="also time the round as S Ray tasks (c)")
    args = ap.parse_args()
    runs_dir = Path(args.runs_dir or tempfile.mkdtemp(prefix="rollout_bench_"))
    base = [f"runs_dir={runs_dir}", f"policy.model={MODEL}", *args.set]
    cfg = load_config(None, [*base, "run_name=bench"])
    in_process = load_config(None, [*base, "run_name=bench-in-process", "policy.engine_processes=0"])
    run = Run(cfg)
    with engines(run) as scope:
        synthesize(run)  # the suite's files and imports: once per process, not once per round
        asyncio.run(
            open_policy(run, open_suite(cfg), 0, cfg.agent.max_context_tokens)[0].close()
        )  # start the engine processes
        calls, engines_seen, stop_recording = record_forwards()
        start = time.perf_counter()
        roll_out(Run(in_process), 0)
        seconds_in_process = time.perf_counter() - start
        stop_recording()
        parent_peak = peak_gib("self")  # the in-process round's engine included
        start = time.perf_counter()
        roll_out(run, 0)
        rollout = time.perf_counter() - start
        child_peaks = [peak_gib(p.process.pid) for p in scope.hf_processes.values()]
        child_idle = [peak_gib(p.process.pid, "VmRSS") for p in scope.hf_processes.values()]
    s = summarize(load_round(cfg.layout, 0))
    decode = [c for c in calls if c[0].shape[1] == 1]
    rows = max(1, sum(c[0].shape[0] for c in decode))
    read = sum((j - i) * n for c in decode for i, j, n in c[4])  # columns attended, padding included
    used = sum(int(c[1].sum()) + c[1].shape[0] for c in decode)  # each row's own length
    print(
        f"round: {s['trees']} trees, {s['node_turns']} turns, {len(calls)} forwards in process "
        f"({len(decode)} decode steps, mean batch {rows / max(1, len(decode)):.1f}, "
        f"mean columns read {read / rows:.0f} of which real {used / rows:.0f}), "
        f"{cfg.rollout.max_concurrent_trees} trees in flight"
    )
    st = engines_seen[0].stats
    print(f"in-process engine thread: decode {st.decode_seconds:.1f} s, prefill {st.prefill_seconds:.1f} s")
    forward = replay(engines_seen[0].model, calls)
    same = tokens(in_process) == tokens(cfg)
    print(
        f"(a) rollout:      {rollout:6.1f} s  ({engine_processes(cfg.policy)} engine processes; span of the trees {s['wall_seconds']:.1f} s)"
    )
    print(
        f"(a0) in process:  {seconds_in_process:6.1f} s  (one engine; trees token for token as (a): {same})"
    )
    print(f"(b) forward-only: {forward:6.1f} s  (the same forwards, nothing else)")
    peaks = ", ".join(f"{g:.2f}" for g in child_peaks)
    idle = ", ".join(f"{g:.2f}" for g in child_idle)
    children = f"; each engine process's peak {peaks}, after the round (its model unloaded) {idle}"
    print(f"memory (GiB): this process's peak after (a0) {parent_peak:.2f}{children if child_peaks else ''}")
    print(
        f"rollout / forward-only = {rollout / forward:.1f}x; in process / rollout = {seconds_in_process / rollout:.1f}x"
    )
    if args.ray_shards:
        passes, ray_cfg = ray_passes(base, args.ray_shards)
        same = tokens(ray_cfg) == tokens(cfg)
        print(
            f"(c) on Ray, {args.ray_shards} shards: {passes[1]:6.1f} s  (first pass, with the workers' start: "
            f"{passes[0]:.1f} s; trees token for token as (a): {same})"
        )
        print(
            f"Ray rollout / forward-only = {passes[1] / forward:.1f}x; (a) / (c) = {rollout / passes[1]:.1f}x"
        )
    if args.runs_dir is None:
        shutil.rmtree(runs_dir, ignore_errors=True)


if __name__ == "__main__":
    interrupts.run_script(main)
