"""Sandboxed REPL costs: worker start-to-ready, tool-call round trip, trivial cells per second.

Run: .venv/bin/python bench/sandbox_bench.py [--starts 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from rao_core import interrupts
from rao_core.agent.sandbox import Sandbox, set_start_method, shutdown_sandboxes
from rao_core.config import SandboxConfig

LIMITS = SandboxConfig()


async def handler(name: str, args: list, kwargs: dict) -> int:
    return 1


def summary(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"mean {1e3 * statistics.mean(xs):6.1f} ms   p95 {1e3 * p95:6.1f} ms   (n={len(xs)})"


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


async def starts(method: str, n: int) -> None:
    set_start_method(method)
    t0 = time.perf_counter()
    first = await Sandbox.start(["get"], ["aget"], LIMITS)  # the zygote path boots its zygote here
    boot = time.perf_counter() - t0
    times, bare, boxes = [], [], [first]
    for _ in range(n):
        t0 = time.perf_counter()
        boxes.append(await Sandbox.start(["get"], ["aget"], LIMITS))
        times.append(time.perf_counter() - t0)
    for _ in range(n):  # what the seccomp filter adds to a start
        t0 = time.perf_counter()
        boxes.append(await Sandbox.start(["get"], ["aget"], SandboxConfig(seccomp=False)))
        bare.append(time.perf_counter() - t0)
    pss = statistics.mean(pss_kib(sb._proc.pid) for sb in boxes[: n + 1]) / 1024
    t0 = time.perf_counter()
    burst = await asyncio.gather(*(Sandbox.start(["get"], ["aget"], LIMITS) for _ in range(n)))
    burst_s = time.perf_counter() - t0
    print(f"start-to-ready [{method:6}]  {summary(times)}   first {1e3 * boot:.0f} ms")
    print(f"  without seccomp           {summary(bare)}")
    print(f"  {n} concurrent starts: {1e3 * burst_s:.0f} ms in all;  PSS per idle worker {pss:.1f} MiB")
    for sb in boxes + list(burst):
        await sb.close()


async def calls_and_cells(n_calls: int = 2000, n_cells: int = 1000) -> None:
    sb = await Sandbox.start(["get"], ["aget"], LIMITS)
    code = f"t = time.perf_counter()\nfor i in range({n_calls}):\n    get(i)\nprint(time.perf_counter() - t)"
    r = await sb.run_cell("import time\n" + code, handler, 60, max_calls=n_calls)
    print(f"sync tool call round trip      {1e6 * float(r.output) / n_calls:6.1f} us per call (n={n_calls})")
    code = "t = time.perf_counter()\nawait asyncio.gather(*(aget(i) for i in range(100)))\nprint(time.perf_counter() - t)"
    r = await sb.run_cell(code, handler, 60, max_calls=100)
    print(f"async calls, 100 concurrent    {1e6 * float(r.output) / 100:6.1f} us per call")
    t0 = time.perf_counter()
    for _ in range(n_cells):
        await sb.run_cell("x = 1", handler, 10)
    dt = time.perf_counter() - t0
    print(
        f"trivial cells                  {n_cells / dt:6.0f} cells/s ({1e6 * dt / n_cells:.0f} us per cell)"
    )
    await sb.close()


async def main(n: int) -> None:
    try:
        await starts("exec", n)
        await starts("zygote", n)
        set_start_method("zygote")
        await calls_and_cells()
    finally:
        await shutdown_sandboxes()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=30)
    starts = ap.parse_args().starts
    interrupts.run_script(lambda: asyncio.run(main(starts)))
