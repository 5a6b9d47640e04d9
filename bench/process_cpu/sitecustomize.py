"""Each Python process's CPU time, written when it exits: put this folder on PYTHONPATH with
RAO_PROC_LOG=<file> and every interpreter started under it (tests, `rao` commands, engine
processes, servers) appends one JSON line. Processes ended by SIGKILL, and Ray's workers, write
nothing. bench/process_cpu_report.py sums the lines by kind of process (docs/testing.md).

    PYTHONPATH=$PWD/bench/process_cpu RAO_PROC_LOG=/tmp/procs.jsonl make test
"""

import atexit
import json
import os
import resource
import sys

_log = os.environ.get("RAO_PROC_LOG")


def _write() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "argv": " ".join(sys.argv)[:300],
        "exe": sys.executable,
        "cpu": round(usage.ru_utime + usage.ru_stime, 2),
        "test": os.environ.get("PYTEST_CURRENT_TEST", "")[:200],
    }
    try:
        with open(_log, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:
        pass


if _log:
    atexit.register(_write)
