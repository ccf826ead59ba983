"""A stand-in service for the fork server's tests: prints what a process is (as JSON), then ends as
its first argument says: ``exit N``, ``raise``, ``message``, ``sleep``, ``atexit`` (a handler and a
non-daemon thread that both print after the module returned), ``gc`` (a second line: the objects the
collector had frozen at the start, and the pages a full collection then copied)."""

from __future__ import annotations

import atexit
import gc
import json
import os
import resource
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path


def status_lines() -> dict[str, str]:
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def main() -> None:
    status = status_lines()
    print(json.dumps({
        "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "env": dict(os.environ),
        "session_leader": os.getsid(0) == os.getpid(), "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "stdin": os.readlink("/proc/self/fd/0"), "signals": {k: status[k] for k in ("SigBlk", "SigIgn", "SigCgt")},
        "handlers": {n: str(signal.getsignal(n)) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)},
        "name": __name__, "modules_main": sys.modules["__main__"].__name__, "tmp": tempfile.gettempdir(),
        "cmdline": Path("/proc/self/cmdline").read_bytes().decode().rstrip("\0"), "orig_argv": sys.orig_argv,
    }), flush=True)  # fmt: skip
    print("to stderr", file=sys.stderr, flush=True)
    how = sys.argv[1]
    if how == "exit":
        sys.exit(int(sys.argv[2]))
    if how == "raise":
        raise ValueError("probe failed")
    if how == "message":
        sys.exit("a message")
    if how == "sleep":
        time.sleep(60)
    if how == "gc":
        frozen, faults = gc.get_freeze_count(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        gc.collect()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        print(json.dumps({"frozen": frozen, "collect_page_faults": faults}), flush=True)
    if how == "atexit":
        atexit.register(lambda: print("atexit ran", flush=True))
        threading.Thread(target=finish_late).start()


def finish_late() -> None:
    time.sleep(0.3)
    print("thread finished", flush=True)


if __name__ == "__main__":
    main()
