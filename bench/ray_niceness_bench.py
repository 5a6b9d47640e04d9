"""Benchmark: how long a Ray worker takes to import a rollout shard's task when other work keeps
every core busy, at Ray's default worker niceness (15) and at 0 (`RAY_worker_niceness=0`).

Each arm starts a local Ray instance in a process of its own (the setting is read when Ray
starts), with one busy process per core at the usual priority beside it, and times 2 tasks that
import `tasks.stages` and `flows.training` (what unpickling a shard task imports). Prints each
arm's wall and CPU seconds per worker and the ratio of the walls.

    .venv/bin/python bench/ray_niceness_bench.py
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys

from rao_core import interrupts

ARM = """
import json, time, ray
ray.init(address="local", include_dashboard=False)

@ray.remote(num_cpus=1)
def shard_imports():
    import os, time
    wall, cpu = time.time(), time.process_time()
    import flows.training, tasks.stages  # noqa: F401
    return time.time() - wall, time.process_time() - cpu, os.nice(0)

print(json.dumps(ray.get([shard_imports.remote() for _ in range(2)])))
ray.shutdown()
"""


def busy() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the script's handler: terminate() ends it quietly
    while True:
        pass


def arm(niceness: str | None) -> list[list[float]]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
    if niceness is not None:
        env["RAY_worker_niceness"] = niceness
    done = subprocess.run([sys.executable, "-c", ARM], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    load = [multiprocessing.Process(target=busy, daemon=True) for _ in range(os.cpu_count() or 1)]
    for p in load:
        p.start()
    try:
        walls = {}
        for name, niceness in (("Ray's default (nice 15)", None), ("RAY_worker_niceness=0", "0")):
            workers = arm(niceness)
            walls[name] = max(w for w, _, _ in workers)
            per = ", ".join(f"{w:.1f} s wall / {c:.1f} s CPU at nice {n}" for w, c, n in workers)
            print(f"{name}: {per}")
        default, usual = walls.values()
        print(
            f"with {len(load)} busy processes beside it: the slower worker took {default / usual:.1f}x as long at nice 15"
        )
    finally:
        for p in load:
            p.terminate()


if __name__ == "__main__":
    interrupts.run_script(main)
