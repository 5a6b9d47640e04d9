"""Benchmark: the default rollout round against the bare model forward it needs.

(a) rollout: round 0 of the default configuration (`rao rollout`: small-inline-root, 8 tasks x 12
    trees, seed 0; change it with --set), in process through HFEngine, timed from the first tree to
    the last; every forward the engine makes is recorded (tokens, positions, slots, columns);
(b) forward-only: the same forwards, in the same order and shapes, replayed through the same model
    and attention into preallocated slots, and nothing else: no admission, sampling, stop checks,
    K/V reuse bookkeeping, cells or asyncio. That is the limit of this engine design on this model.

Prints both and `rollout / forward-only`. The round's trees are the same at every concurrency (the
sampling is seeded per node), so `--set rollout.max_concurrent_trees=16` times today's schedule.

    .venv/bin/python bench/rollout_bench.py [--set rollout.max_concurrent_trees=16] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from rao_core.campaign import engines, prepare
from rao_core.config import load_config
from rao_core.engines.hf import HFEngine
from rao_core.engines.hf_batch import KVSlots, forward_in_slots
from rao_core.rollout import load_round, rollout_round, summarize


def record_forwards() -> tuple[list[tuple], list]:
    """Patch HFEngine._forward to keep (ids, positions, first slot, write columns, runs) per call."""
    calls, engines, original = [], [], HFEngine._forward

    def recording(self, ids, pos, slots):
        calls.append((ids.clone(), pos.clone(), slots._first, slots._write_cols.clone(), slots.runs))
        if not engines:
            engines.append(self)
        return original(self, ids, pos, slots)

    HFEngine._forward = recording
    return calls, engines


@torch.inference_mode()
def replay(model, calls: list[tuple]) -> float:
    """Seconds to run the recorded forwards through the model alone (the mask each plan builds
    included), one intra-op thread as in the engine's worker thread."""
    torch.set_num_threads(1)
    slots = KVSlots(next(model.parameters()).device)
    slots.reserve(
        max(first + ids.shape[0] for ids, _, first, *_ in calls), max(int(c[1].max()) + 1 for c in calls)
    )
    start = time.perf_counter()
    for ids, pos, first, cols, runs in calls:
        slots.plan(
            first, cols.clamp(max=slots.cols), pos, runs
        )  # the recorded scratch column may sit elsewhere
        forward_in_slots(model, ids, pos, slots)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--runs-dir", default=None, help="where the round is written (default: a temporary folder)"
    )
    args = ap.parse_args()
    runs_dir = Path(args.runs_dir or tempfile.mkdtemp(prefix="rollout_bench_"))
    cfg = load_config(None, [f"runs_dir={runs_dir}", "run_name=bench", *args.set])
    calls, engines_seen = record_forwards()
    with engines(cfg):
        prepare(cfg)
        start = time.perf_counter()
        rollout_round(cfg)
        rollout = time.perf_counter() - start
    s = summarize(load_round(cfg, cfg.rollout.round))
    decode = [c for c in calls if c[0].shape[1] == 1]
    rows = max(1, sum(c[0].shape[0] for c in decode))
    read = sum((j - i) * n for c in decode for i, j, n in c[4])  # columns attended, padding included
    used = sum(int(c[1].sum()) + c[1].shape[0] for c in decode)  # each row's own length
    print(
        f"round: {s['trees']} trees, {s['node_turns']} turns, {len(calls)} forwards "
        f"({len(decode)} decode steps, mean batch {rows / max(1, len(decode)):.1f}, "
        f"mean columns read {read / rows:.0f} of which real {used / rows:.0f}), "
        f"{cfg.rollout.max_concurrent_trees} trees in flight"
    )
    st = engines_seen[0].stats
    print(
        f"engine thread: decode {st.decode_seconds:.1f} s, prefill {st.prefill_seconds:.1f} s, sorts {st.sorts}"
    )
    forward = replay(engines_seen[0].model, calls)
    print(
        f"(a) rollout:      {rollout:6.1f} s  (the round, trees written; span of the trees {s['wall_seconds']:.1f} s)"
    )
    print(f"(b) forward-only: {forward:6.1f} s  (the same forwards, nothing else)")
    print(f"rollout / forward-only = {rollout / forward:.1f}x")
    if args.runs_dir is None:
        shutil.rmtree(runs_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
