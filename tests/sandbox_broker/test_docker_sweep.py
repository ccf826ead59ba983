"""The docker exec wrapper's sweep (docker_sweep.py) run for real in a new pid namespace (no Docker):
it kills what its command left behind but never the container's keep-alive, even where an exec
started before docker-init forked the keep-alive, so that the keep-alive is not the lowest pid after
init. (Killing it ended the container: docker-init exited and the kernel SIGKILLed the exec itself,
a finished setup command reported as exit 137.)"""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from services.sandbox_broker.backends import docker_sweep
from services.sandbox_broker.backends.docker import KEEP_RUNNING


def _in_new_pid_namespace(script: str) -> str:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"no pid namespace here: {done.stderr.strip()[:200]}")
    return done.stdout


CHECK = """# rollout-exec: the test's own check (marked, so the sweep spares it too)
sleep 4
if kill -0 "$1" 2>/dev/null; then echo keep-alive alive; else echo keep-alive killed; fi
n=0
for d in /proc/[0-9]*/cmdline; do
  case $(tr '\\0' ' ' < "$d" 2>/dev/null) in 'sleep 1000 ') n=$((n+1));; esac
done
echo "left $n"
"""


def test_the_sweep_spares_a_keep_alive_started_after_the_exec() -> None:
    exec_ = shlex.join(docker_sweep.wrap(["sh", "-c", "sleep 1000 & sleep 2"], {}, False))
    keep_alive = shlex.join(KEEP_RUNNING)
    # pid 1 stands for docker-init; the exec is forked first, so it gets the lower pid
    script = f"{exec_} & {keep_alive} & sh -c {shlex.quote(CHECK)} check $!"
    out = _in_new_pid_namespace(script)
    assert "keep-alive alive" in out, out
    assert "left 0" in out, out  # what the command left behind was swept
