"""The embedded Redis: starts, has streams and XAUTOCLAIM, persists with AOF, stops."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from services.cli.redis_cmd import masked
from services.runtime.net import free_port
from services.runtime.redis_server import EmbeddedRedis, find_server_binary, redis_url_or_embedded
from tests.support.processes import REPO_ROOT, python_env


def test_streams_and_xautoclaim_work() -> None:
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        client.xgroup_create("s", "g", id="0", mkstream=True)
        client.xadd("s", {"a": "1"})
        assert client.xreadgroup("g", "c1", {"s": ">"}, count=1)
        time.sleep(0.05)
        _, claimed, _ = client.xautoclaim("s", "g", "c2", min_idle_time=10)
        assert len(claimed) == 1
        client.close()


def test_stop_ends_the_process_and_frees_the_port() -> None:
    server = EmbeddedRedis()
    server.start()
    port = server.port
    server.stop()
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=int(port), socket_connect_timeout=0.5).ping()


def test_a_server_whose_owner_is_killed_goes_with_it() -> None:
    """kill -9 of the process that started the server (no cleanup of its own runs) ends the server:
    its port and password went with the owner, so it could only have stayed as a leak."""
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom services.runtime.redis_server import EmbeddedRedis\n"
         "s = EmbeddedRedis(); s.start(); print(s._proc.pid, s.port, s._tmp.name, flush=True); time.sleep(600)"],
        env=python_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        pid, port, directory = owner.stdout.readline().split()
        assert Path(f"/proc/{pid}").exists()
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    shutil.rmtree(directory, ignore_errors=True)  # the killed owner could not remove it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(int(pid)):
        time.sleep(0.05)
    assert not _running(int(pid)), "the server outlived its killed owner"
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=int(port), socket_connect_timeout=0.5).ping()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie's parent is init here, which reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_appendonly_survives_a_restart(tmp_path: Path) -> None:
    port = free_port()
    with EmbeddedRedis(port=port, appendonly=True, data_dir=tmp_path) as server:
        redis.Redis.from_url(server.url).xadd("kept", {"v": "1"})
    with EmbeddedRedis(port=port, appendonly=True, data_dir=tmp_path) as server:
        assert redis.Redis.from_url(server.url).xlen("kept") == 1


def test_configured_url_is_used_as_is() -> None:
    with redis_url_or_embedded("redis://10.0.0.1:6379/0") as url:
        assert url == "redis://10.0.0.1:6379/0"


def test_binary_is_found_without_apt() -> None:
    assert find_server_binary().is_file()


def test_rollout_redis_runs_in_the_foreground_and_stops_on_sigterm(tmp_path: Path) -> None:
    """It never prints its password: the URL is masked, and written whole to a file only its user reads."""
    port = free_port()
    (tmp_path / "pw").write_text("pw-1\n")
    env = {"ROLLOUT_REDIS_PASSWORD_FILE": str(tmp_path / "pw"), "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "redis", "--port", str(port)],
        cwd=REPO_ROOT, env=python_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        with pytest.raises(redis.RedisError):  # no password, no access (once it is up)
            _wait_up(port)
            redis.Redis(port=int(port), socket_connect_timeout=0.5, protocol=2).ping()
        client = redis.Redis(port=port, password="pw-1", socket_connect_timeout=0.5)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                time.sleep(0.05)
        assert client.ping()
        proc.terminate()
        proc.wait(timeout=10)
        with pytest.raises(redis.ConnectionError):
            redis.Redis(port=int(port), socket_connect_timeout=0.5).ping()
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate(timeout=5)[0].decode()
    assert f"redis://:***@127.0.0.1:{port}/0" in out and "pw-1" not in out, out
    url_file = tmp_path / ".rollout" / "redis.url"  # the default: under the user's home
    assert url_file.read_text() == f"redis://:pw-1@127.0.0.1:{port}/0\n"
    assert url_file.stat().st_mode & 0o777 == 0o600 and url_file.parent.stat().st_mode & 0o777 == 0o700
    assert str(url_file) in out


def test_rollout_redis_writes_its_url_where_asked_and_masks_it(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text("old")
    url_file.chmod(0o644)  # an existing file is made private too
    assert masked("redis://user:secret@[::1]:6379/0") == "redis://:***@[::1]:6379/0"
    assert masked("redis://h:1/0") == "redis://h:1/0"
    tmp = tmp_path / "tmp"  # where its data directory goes
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "redis", "--port", str(free_port()), "--url-file", str(url_file)],
        cwd=REPO_ROOT, env=python_env({"ROLLOUT_REDIS_PASSWORD": "pw-2", "TMPDIR": str(tmp)}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = ""
        while "redis listening" not in line and proc.poll() is None:
            line = proc.stdout.readline()
        assert "redis listening: redis://:***@" in line and "pw-2" not in line, line
        assert url_file.read_text().startswith("redis://:pw-2@") and url_file.stat().st_mode & 0o777 == 0o600
        assert [d.name[:13] for d in tmp.iterdir()] == ["rollout-redis"]
    finally:
        proc.terminate()  # at once on the line: SIGTERM stops the server and removes its data directory
        proc.communicate(timeout=10)
    assert proc.returncode == 0 and list(tmp.iterdir()) == []


def _wait_up(port: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            redis.Redis(port=int(port), socket_connect_timeout=0.5, protocol=2).ping()
        except redis.AuthenticationError:
            return
        except redis.ConnectionError:
            time.sleep(0.05)
