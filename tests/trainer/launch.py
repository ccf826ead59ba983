"""Starting and reaping the ranks of a multi-process trainer test."""

from __future__ import annotations

import subprocess
import sys

from services.runtime.net import free_port


def torchrun_argv(nproc: int, module: str, *args: str) -> list[str]:
    """``torchrun --nproc-per-node N -m MODULE ARGS`` on a free loopback port."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
            "127.0.0.1", "--master-port", str(free_port()), "-m", module, *args]  # fmt: skip


def wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Every process's exit code; any still running at the end (a failure elsewhere) is killed."""
    try:
        return [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
