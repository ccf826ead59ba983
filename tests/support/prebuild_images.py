"""``make test`` runs this beside the tests: the platform's images built into their cache
(``scripts/build-images.sh`` against a private dockerd), so that the compose test only loads them
(``build-images.sh`` locks the cache: a compose test that starts first waits for this build). On a
fresh machine that build (a Debian base by mmdebstrap, the pinned dependencies, the service) was 110 s
of the compose test.

Nothing depends on this succeeding: where the images are already in the cache it does nothing, and
where it cannot build them (no dockerd, no registry, a failed build) it says why and exits 0, and the
compose test builds them itself, as it always did. Its output: the log ``make test`` names."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from services.runtime.dockerd import private_dockerd
from services.runtime.processes import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "build-images.sh"
TIMEOUT_S = 1800


def main() -> int:
    if subprocess.run(["bash", str(SCRIPT), "--cached"], cwd=REPO_ROOT).returncode == 0:
        print("the images are in the cache already")
        return 0
    started = time.monotonic()
    with private_dockerd() as found:
        if isinstance(found, str):
            print(f"not built here: {found}")
            return 0
        env = {**os.environ, "DOCKER_HOST": found.url}
        try:
            done = subprocess.run(["bash", str(SCRIPT)], cwd=REPO_ROOT, env=env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"not built within {TIMEOUT_S} s: the compose test builds them")
            return 0
    outcome = "built" if done.returncode == 0 else f"not built (exit {done.returncode}): the compose test builds them"
    print(f"images {outcome} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.exit(main())
