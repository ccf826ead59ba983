"""The cost of gVisor beside namespaces and runc: ``python -m services.benchmarks.runtimes [--json PATH]``.

As root, with dockerd, runsc, bwrap and busybox installed: a private dockerd offering runsc
(``--network=host``, see docs/sandbox_broker.md) runs a busybox image under runc and runsc and
times container create+start, ``docker exec true`` and a process spawned inside; beside them,
``bwrap --unshare-all ... true`` and ``runsc --network=none do true``. Prints p50s in ms.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import docker

from services.benchmarks.report import percentile, write_json
from services.runtime.dockerd import private_dockerd

IMAGE = "rollout-bench/busybox:latest"
SPAWNS = 200


def _ms(samples: list[float]) -> float:
    return round(percentile(samples, 50) * 1000, 1)


def _timed(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd="/tmp")
        samples.append(time.perf_counter() - started)
    return _ms(samples)


def _busybox(client: docker.DockerClient) -> None:
    busybox = shutil.which("busybox")
    assert busybox is not None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(busybox, "bin/busybox")
        for applet in ("sh", "true", "sleep"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            archive.addfile(link)
    repository, _, tag = IMAGE.partition(":")
    client.api.import_image_from_data(buffer.getvalue(), repository=repository, tag=tag)


def _engine(client: docker.DockerClient, runtime: str, runs: int) -> dict[str, float]:
    starts, execs, containers = [], [], []
    try:
        for _ in range(runs):
            started = time.perf_counter()
            container = client.containers.create(IMAGE, ["sleep", "2147483647"], runtime=runtime, init=True,
                                                 network_mode="none", cap_drop=["ALL"], pids_limit=4096)  # fmt: skip
            containers.append(container)
            container.start()
            starts.append(time.perf_counter() - started)
        for _ in range(runs * 4):
            started = time.perf_counter()
            containers[-1].exec_run(["true"])
            execs.append(time.perf_counter() - started)
        loop = f"i=0; while [ $i -lt {SPAWNS} ]; do /bin/true; i=$((i+1)); done"
        started = time.perf_counter()
        containers[-1].exec_run(["sh", "-c", loop])
        spawn = (time.perf_counter() - started) / SPAWNS
    finally:
        for container in containers:
            container.remove(force=True)
    return {"create_start_ms_p50": _ms(starts), "exec_ms_p50": _ms(execs), "spawn_ms": round(spawn * 1000, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.benchmarks.runtimes", description=__doc__)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    runsc = shutil.which("runsc")
    if runsc is None or shutil.which("bwrap") is None:
        print("runsc and bwrap are needed (apt-get install runsc bubblewrap)")
        return 2
    figures: dict[str, Any] = {
        "bwrap_true_ms_p50": _timed(
            ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"], args.runs
        ),  # fmt: skip
        "runsc_do_true_ms_p50": _timed([runsc, "--network=none", "do", "true"], args.runs),
    }
    with private_dockerd(_busybox, runtimes={"runsc": [runsc, "--network=host"]}) as daemon:
        if isinstance(daemon, str):
            print(daemon)
            return 2
        client = docker.DockerClient(base_url=daemon.url)
        for runtime in ("runc", "runsc"):
            figures[f"docker_{runtime}"] = _engine(client, runtime, args.runs)
        client.close()
    for key, value in figures.items():
        print(f"{key:28} {value}")
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
