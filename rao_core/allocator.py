"""Keep freed memory in the process instead of handing it back to the kernel at once (glibc).

glibc serves every allocation above its mmap threshold (at most 32 MB, adjusted as blocks come
and go) with a fresh mmap and unmaps it on free, and trims the heap's free top above twice that.
A training step or a decode step allocates and frees the same large tensors over and over
(activations, a chunk's logits over a 49,152-token vocabulary), so each one is paid again in page
faults: an elementwise pass over a freshly allocated 184 MB tensor took 4x one over a reused one
(bench/train_bench.py --throughput, docs/training.md "Throughput"). Raising both thresholds makes
freed blocks reusable. The cost: the process keeps its peak memory until it exits (the memory
plan's figures are peaks anyway).

Called by the processes that run models: the trainer, the warm start and the engines. A no-op
where the C library is not glibc; RAO_KEEP_SYSTEM_MALLOC=1 leaves the defaults.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
_done = False


def keep_freed_memory(mmap_threshold: int = 1 << 30, trim_threshold: int = 2**31 - 1) -> bool:
    """Raise glibc's mmap and trim thresholds for this process, once; True when they were set."""
    global _done
    if _done or os.environ.get("RAO_KEEP_SYSTEM_MALLOC"):
        return _done
    try:
        libc = ctypes.CDLL("libc.so.6")
        _done = bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)
        )
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        _done = False
    return _done
