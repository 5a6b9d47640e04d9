"""Runs `vllm serve` as a child and ends it when the process that started it is gone.

Started by vllm_server.py with the vLLM environment's own Python (only the standard library is
used here, so rao_core need not be installed there):

    .venv-vllm/bin/python rao_core/engines/vllm_watchdog.py PARENT_PID -- vllm-arguments...

Why: the server runs in a session of its own (so the campaign can kill its whole process group), so
it would outlive a campaign killed with SIGKILL, holding its memory and port. This watchdog polls
the parent once a second; the exit code is the server's.
"""

import os
import signal
import subprocess
import sys
import time


def main() -> int:
    parent = int(sys.argv[1])
    args = sys.argv[sys.argv.index("--") + 1 :]
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args])

    def stop(signum, frame):
        server.terminate()

    signal.signal(signal.SIGTERM, stop)
    while server.poll() is None:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            server.terminate()
            break
        time.sleep(1.0)
    try:
        return server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


if __name__ == "__main__":
    sys.exit(main())
