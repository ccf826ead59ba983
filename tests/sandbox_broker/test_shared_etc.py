"""A sandbox's /etc, copied once per broker and bound whole (backends/shared_etc.py)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from services.protocol.sandboxes import ExecRequest, Resources, Template
from services.sandbox_broker.backends import netns, shared_etc
from services.sandbox_broker.backends.base import LABEL_LEASE, SandboxSpec
from services.sandbox_broker.backends.bwrap import HOST_ETC, SandboxPaths, bwrap_argv
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.backends.shared_etc import SharedEtc
from services.sandbox_broker.settings import BrokerSettings
from tests.sandbox_broker.conftest import needs_bwrap


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host tree with some of HOST_ETC: a file, a link, a directory with a secret in it, a secret file."""
    etc = tmp_path / "host" / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "ssl" / "certs" / "ca.pem").write_text("CERT")
    (etc / "ssl" / "certs" / "link.pem").symlink_to("ca.pem")
    (etc / "ssl" / "private").mkdir(mode=0o700)
    (etc / "ssl" / "private" / "key.pem").write_text("KEY")
    (etc / "ssl" / "readme").write_text("r")
    (etc / "ssl" / "readme").chmod(0o640)  # not for others to read: not copied
    (etc / "ld.so.cache").write_bytes(b"\x00cache")
    (etc / "localtime").symlink_to("/usr/share/zoneinfo/Etc/UTC")
    (etc / "nsswitch.conf").write_text("hosts: files dns\n")
    (etc / "nsswitch.conf").chmod(0o600)  # a secret top-level file: not copied
    (etc / "gai.conf").write_text("gai\n")
    return tmp_path / "host"


def test_the_copy_holds_what_the_sandbox_user_could_read_and_its_own_files(host: Path, tmp_path: Path) -> None:
    old = os.umask(0o077)  # the broker's umask does not make them unreadable
    try:
        shared = SharedEtc(tmp_path / "state" / "etc", 1234, host=host)
        plain, egress = shared.path(egress=False), shared.path(egress=True)
    finally:
        os.umask(old)
    assert plain.parent == egress.parent and plain.name == "plain" and egress.name == "egress"
    assert sorted(p.name for p in plain.iterdir()) == ["group", "ld.so.cache", "localtime", "passwd", "ssl"]
    assert (plain / "ld.so.cache").read_bytes() == b"\x00cache"
    assert os.readlink(plain / "localtime") == "/usr/share/zoneinfo/Etc/UTC"  # a link, as on the host
    assert os.readlink(plain / "ssl" / "certs" / "link.pem") == "ca.pem"
    # on one filesystem a link is the host's, linked (no inode made); a file is a copy of its own
    assert os.lstat(plain / "localtime").st_ino == os.lstat(host / "etc" / "localtime").st_ino
    assert os.lstat(egress / "ssl" / "certs" / "link.pem").st_ino == os.lstat(host / "etc/ssl/certs/link.pem").st_ino
    assert os.lstat(plain / "ld.so.cache").st_ino != os.lstat(host / "etc" / "ld.so.cache").st_ino
    assert sorted(p.name for p in (plain / "ssl").iterdir()) == ["certs"]  # private/ and readme left out
    assert (plain / "passwd").read_text() == shared_etc.passwd(1234)
    assert "sandbox:x:1234:" in (plain / "group").read_text()
    for path in (plain, plain / "passwd", plain / "group", plain.parent):
        assert path.stat().st_mode & 0o005 in (0o004, 0o005), path  # others read (and enter)
    assert sorted(p.name for p in egress.iterdir()) == sorted(
        ["gai.conf", "group", "hosts", "ld.so.cache", "localtime", "passwd", "resolv.conf", "ssl"]
    )
    assert (egress / "resolv.conf").read_text() == netns.RESOLV_CONF
    assert (egress / "hosts").read_text() == netns.HOSTS


def test_links_are_made_anew_where_they_cannot_be_linked(
    host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another filesystem (EXDEV), or fs.protected_hardlinks refusing a non-root broker: a new link."""

    def cross_device(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    plain = SharedEtc(tmp_path / "etc", 1000, host=host).path(egress=False)
    assert os.readlink(plain / "localtime") == "/usr/share/zoneinfo/Etc/UTC"
    assert os.readlink(plain / "ssl" / "certs" / "link.pem") == "ca.pem"
    assert os.lstat(plain / "localtime").st_ino != os.lstat(host / "etc" / "localtime").st_ino


def test_a_host_file_that_changes_gives_new_sandboxes_a_new_copy(
    host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = SharedEtc(tmp_path / "etc", 1000, host=host)
    first = shared.path(egress=False)
    assert shared.path(egress=False) == first  # checked again within CHECK_EVERY_S: the same
    monkeypatch.setattr(shared_etc, "CHECK_EVERY_S", 0.0)
    assert shared.path(egress=False) == first  # nothing changed: the same directory
    (host / "etc" / "ld.so.cache").write_bytes(b"\x00new cache!")
    second = shared.path(egress=False)
    assert second != first and (second / "ld.so.cache").read_bytes() == b"\x00new cache!"
    assert (first / "ld.so.cache").read_bytes() == b"\x00cache"  # the sandboxes made with it keep theirs
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == sorted([first.parent.name, second.parent.name])


def test_the_start_removes_the_copies_no_sandbox_was_made_with(host: Path, tmp_path: Path) -> None:
    shared = SharedEtc(tmp_path / "etc", 1000, host=host)
    used = shared.path(egress=True)
    (tmp_path / "etc" / "0123456789abcdef" / "plain").mkdir(parents=True)  # an old one
    (tmp_path / "etc" / ".0123-99-1").mkdir()  # a build cut short
    sandboxes = tmp_path / "sandboxes"
    (sandboxes / "loc-1").mkdir(parents=True)
    (sandboxes / "loc-1" / "meta.json").write_text(json.dumps({"etc": str(used)}))
    (sandboxes / "loc-2").mkdir()
    (sandboxes / "loc-2" / "meta.json").write_text("{not json")  # unreadable: ignored
    (sandboxes / "loc-3").mkdir()
    (sandboxes / "loc-3" / "meta.json").write_text(json.dumps({"etc": None}))  # files one by one
    (sandboxes / "loc-4").mkdir()
    (sandboxes / "loc-4" / "meta.json").write_text("[]")  # not a sandbox's meta: ignored
    removed = shared.clean_unused(sandboxes)
    assert sorted(p.name for p in removed) == [".0123-99-1", "0123456789abcdef"]
    assert [p.name for p in (tmp_path / "etc").iterdir()] == [used.parent.name]


def test_an_unisolated_egress_sandbox_binds_its_own_files_one_by_one(host: Path, tmp_path: Path) -> None:
    shared = SharedEtc(tmp_path / "etc", 1000, host=host)
    assert shared.for_sandbox("egress", own_namespace=False) is None
    assert shared.for_sandbox("egress", own_namespace=True) == str(shared.path(egress=True))
    assert shared.for_sandbox("none", own_namespace=False) == str(shared.path(egress=False))


def test_bubblewrap_binds_the_shared_etc_once_instead_of_each_file(tmp_path: Path) -> None:
    paths = SandboxPaths(tmp_path / "sb")
    one_by_one = bwrap_argv("bwrap", paths, uid=1000, network=False, cwd="/workspace")
    whole = bwrap_argv("bwrap", paths, uid=1000, network=False, cwd="/workspace", etc="/state/etc/x/plain")
    targets = [whole[i + 2] for i, a in enumerate(whole) if a.startswith("--ro-bind")]
    assert [t for t in targets if t.startswith("/etc")] == ["/etc"]
    assert whole[whole.index("/state/etc/x/plain") - 1 :][:3] == ["--ro-bind", "/state/etc/x/plain", "/etc"]
    assert all(path in one_by_one for path in HOST_ETC) and not any(path in whole for path in HOST_ETC)


@needs_bwrap
def test_a_sandbox_sees_the_shared_etc_read_only(state_dir: Path) -> None:
    async def scenario() -> str:
        async with _sandbox(state_dir) as (backend, sandbox_id, _):
            shell = "ls /etc; cat /etc/passwd; sha256sum < /etc/ld.so.cache; touch /etc/x 2>&1; echo $?"
            return (await backend.exec(sandbox_id, ExecRequest(shell=shell, timeout_s=30))).stdout

    out = asyncio.run(scenario()).splitlines()
    uid = BrokerSettings().sandbox_uid
    host_names = sorted(Path(p).name for p in HOST_ETC if Path(p).exists() and os.stat(p).st_mode & 0o004)
    assert out[: len(host_names) + 2] == sorted([*host_names, "group", "passwd"])
    assert f"sandbox:x:{uid}:{uid}:sandbox:/workspace:/bin/bash" in out
    assert f"{hashlib.sha256(Path('/etc/ld.so.cache').read_bytes()).hexdigest()}  -" in out
    assert "Read-only file system" in " ".join(out) and out[-1] == "1"


@needs_bwrap
def test_a_sandbox_with_a_shared_etc_has_no_etc_of_its_own_until_the_copy_is_gone(state_dir: Path) -> None:
    """Fewer files on the host per sandbox; where its copy is gone (removed by hand), a new bubblewrap
    of the sandbox (here a second, concurrent command's) gets its passwd and group one by one."""

    async def scenario() -> tuple[bool, bool, list[str]]:
        async with _sandbox(state_dir) as (backend, sandbox_id, root):
            made_without = not (root / "etc").exists()
            copy = Path(json.loads((root / "meta.json").read_text())["etc"])
            _move(copy, copy.with_name("moved"))  # gone, as if removed by hand
            try:
                asked = [ExecRequest(shell=f"sleep {s}; grep -c sandbox /etc/passwd", timeout_s=30) for s in (1, 0)]
                results = await asyncio.gather(*(backend.exec(sandbox_id, r) for r in asked))
            finally:
                _move(copy.with_name("moved"), copy)
            return made_without, (root / "etc" / "passwd").is_file(), [r.stdout.strip() for r in results]

    made_without, written, seen = asyncio.run(scenario())
    assert made_without
    assert seen == ["1", "1"]  # the agent's command through the bound copy, the second through its own files
    assert written


@asynccontextmanager
async def _sandbox(state_dir: Path) -> AsyncIterator[tuple[LocalBackend, str, Path]]:
    """A started local backend and one plain sandbox of it (its id, its directory on the host)."""
    settings = BrokerSettings(state_dir=state_dir / "state", backend="local", redis_url="redis://127.0.0.1:1")
    backend = LocalBackend(settings)
    await backend.start()
    try:
        sandbox = await backend.create(SandboxSpec(Template(name="bare"), Resources(), "none", {LABEL_LEASE: "x"}))
        try:
            yield backend, sandbox.sandbox_id, settings.state_dir / "sandboxes" / sandbox.sandbox_id
        finally:
            await backend.destroy(sandbox.sandbox_id)
    finally:
        await backend.close()


def _move(path: Path, to: Path) -> None:
    path.rename(to)
