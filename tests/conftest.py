"""Fixtures shared by every test: a real Redis server for the session, a clean keyspace per test."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.runtime import forkserver
from services.runtime.processes import REPO_ROOT, python_env
from services.runtime.redis_cluster import EmbeddedRedisCluster
from services.runtime.redis_server import EmbeddedRedis


@pytest.fixture(scope="session", autouse=True)
def _service_forkserver() -> Iterator[None]:
    """The services this test process starts are forked from one interpreter with their libraries
    imported (services/runtime/forkserver.py): about half a second of CPU less per start, hundreds of
    starts per run. ``ROLLOUT_TEST_FORKSERVER=0`` execs each one instead."""
    if os.environ.get("ROLLOUT_TEST_FORKSERVER", "1") == "0":
        yield
        return
    path = Path(tempfile.mkdtemp(prefix="rollout-forkserver-")) / "socket"
    try:
        server = forkserver.start(path, python_env(), REPO_ROOT)
    except (OSError, RuntimeError) as exc:  # every service is exec'd, as without it
        print(f"no fork server for this test process ({exc}): services are exec'd", file=sys.stderr)
        shutil.rmtree(path.parent, ignore_errors=True)
        yield
        return
    os.environ[forkserver.ENV] = str(path)
    try:
        yield
    finally:
        os.environ.pop(forkserver.ENV, None)
        server.kill()
        server.wait()
        shutil.rmtree(path.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def _redis_process() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture(scope="module")
def redis_server(_redis_process: EmbeddedRedis) -> EmbeddedRedis:
    """One real Redis-compatible server (the embedded mechanism) for the whole session, flushed
    before each test module: fleet-wide state one module leaves behind (the proxy's pool members,
    the broker's leases) never reaches the next module's services."""
    client = redis.Redis.from_url(_redis_process.url)
    client.flushall()
    client.close()
    return _redis_process


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    """The session server's URL, flushed before each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def service_logs(tmp_path: Path) -> Path:
    """Where subprocess services write their logs (kept in pytest's tmp dir for post-mortems)."""
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedRedisCluster]:
    """A 3-master Redis Cluster (valkey in cluster mode, one password) on loopback, for the session.

    Started only by the tests that ask for it (about 2-3 s); its URL has the ``redis+cluster://``
    scheme, which every service and the trainer turn into a cluster client."""
    with EmbeddedRedisCluster(masters=3) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_url(redis_cluster: EmbeddedRedisCluster) -> str:
    """The cluster's URL, every node flushed before the test."""
    redis_cluster.flush()
    return redis_cluster.url


@pytest.fixture
def tarpit() -> Iterator[str]:
    """A listening socket whose accept queue is full: the kernel drops every new SYN, so a connect
    neither succeeds nor is refused (what an engine's port looks like under a connection storm)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(2):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(server.getsockname())
        fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        for sock in (*fillers, server):
            sock.close()


DURATIONS = Path(__file__).with_name("durations.json")  # measured seconds per file (its "about" says how)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Files with the longest tests run first: in a parallel run (``make test``, which keeps this order
    with ``--no-loadscope-reorder``) the longest files then overlap the many short ones instead of
    finishing alone at the end. A file's weight is its measured seconds in ``durations.json``; a file
    not measured there weighs a tenth of the largest ``timeout`` mark among its ``slow`` tests (what
    its author allowed it, a proxy for its length); the others come last, in their collection order.

    xdist hands each of its N processes two files at the start, the second to run after the first:
    so that no long file waits behind the longest ones, files N+1 to 2N are N short ones. Only the
    files with a test selected take a place: this orders what is left after ``-m``, ``-k`` and the
    paths deselected the others (the hooks this one wraps)."""
    for item in items:  # a test on a private dockerd is a docker test, marked or not (``-m "not docker"``)
        if {"dockerd", "runsc_dockerd", "daemon"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)
    yield
    measured: dict[str, float] = json.loads(DURATIONS.read_text())["seconds"]
    weight: dict[str, float] = {}
    for item in items:
        file = item.nodeid.split("::")[0]
        if file in measured:
            weight[file] = measured[file]
        elif item.get_closest_marker("slow"):
            timeout = item.get_closest_marker("timeout")
            allowed = float(timeout.args[0]) if timeout and timeout.args else 120.0
            weight[file] = max(weight.get(file, 0.0), allowed / 10)
    files = sorted(dict.fromkeys(item.nodeid.split("::")[0] for item in items), key=lambda f: -weight.get(f, 0.0))
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        short = list(reversed(files[workers:]))[:workers]
        files = files[:workers] + short + [f for f in files if f not in short and f not in files[:workers]]
    rank = {file: i for i, file in enumerate(files)}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a file's order is kept
