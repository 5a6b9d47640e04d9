"""Stands in for `srun --nodes=N --ntasks-per-node=1` on one machine: runs the command N times at
once, each copy a "node" that finds the others through torchrun's rendezvous on 127.0.0.1. Like
srun with --kill-on-bad-exit, once one copy fails the others get 30 s, then are killed; the exit
code is the first failure's.

    python tests/train/loopback_nodes.py N command...
"""

import subprocess
import sys
import time


def main() -> int:
    n, cmd = int(sys.argv[1]), sys.argv[2:]
    nodes = [subprocess.Popen(cmd) for _ in range(n)]
    failed_at, code = None, 0
    while any(p.poll() is None for p in nodes):
        bad = [p.returncode for p in nodes if p.returncode not in (None, 0)]
        if bad and failed_at is None:
            failed_at, code = time.monotonic(), bad[0]
        if failed_at is not None and time.monotonic() - failed_at > 30:
            for p in nodes:
                p.kill()
        time.sleep(0.2)
    return code or next((p.returncode for p in nodes if p.returncode), 0)


if __name__ == "__main__":
    sys.exit(main())
