"""Task images as the sandbox's root filesystem on the local backend: image layouts and whiteouts,
the image's Env/WorkingDir/User, no host /usr unless asked, the store's LRU budget, and no mounts
left behind (relative state dir, kill -9)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from services.protocol.sandboxes import ExecRequest, Resources, Template
from services.sandbox_broker.backends import overlay
from services.sandbox_broker.backends.base import SandboxSpec
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.images.sources import open_source
from services.sandbox_broker.images.store import ImageStore
from services.sandbox_broker.images.unpack import tree_size, unpack
from services.sandbox_broker.settings import BrokerSettings
from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap, run
from tests.sandbox_broker.images_support import busybox_image, calc_repo_image
from tests.support.processes import REPO_ROOT

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")


def _oci_layout(docker_tar: Path, out: Path) -> Path:
    """The same image as an OCI image layout (gzip-free blobs), made by hand from the docker tar."""
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    with tarfile.open(docker_tar) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))[0]  # type: ignore[arg-type]
        config = blob(tar.extractfile(manifest["Config"]).read(), "application/vnd.oci.image.config.v1+json")  # type: ignore[union-attr]
        layers = [blob(tar.extractfile(n).read(), "application/vnd.oci.image.layer.v1.tar") for n in manifest["Layers"]]  # type: ignore[union-attr]
    image = json.dumps({"schemaVersion": 2, "config": config, "layers": layers}).encode()
    entry = blob(image, "application/vnd.oci.image.manifest.v1+json")
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    return out


def test_layouts_unpack_with_whiteouts(tmp_path: Path) -> None:
    docker_tar = busybox_image(tmp_path / "img")
    layout = _oci_layout(docker_tar, tmp_path / "oci")
    trees = []
    for source_path in (docker_tar, layout):
        source = open_source(source_path)
        assert source.config.workdir == "/testbed" and source.config.user == "agent"
        assert "FOO=from-image" in source.config.env and len(source.layers) == 2
        tree = tmp_path / f"tree-{source.kind}"
        unpack(source, tree)
        assert sorted(p.name for p in (tree / "testbed").iterdir()) == ["a.txt", "pkg"]  # b.txt whited out
        assert [p.name for p in (tree / "testbed" / "pkg").iterdir()] == ["new.py"]  # opaque: old.py gone
        assert os.readlink(tree / "bin" / "sh") == "busybox"
        trees.append(tree)
    assert open_source(docker_tar).digest == open_source(layout).digest  # the config's digest names both


def test_store_budget_evicts_least_recently_used(tmp_path: Path) -> None:
    sources = []
    for name in ("one", "two", "three"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data").write_bytes(os.urandom(64 * 1024))
        sources.append(str(tmp_path / name))
    in_use: set[str] = set()
    store = ImageStore(tmp_path / "store", os.getuid(), budget_bytes=150 * 1024, in_use=lambda: in_use)
    first = store.prepare(sources[0])
    assert first.prepare_s > 0 and store.prepare(sources[0]).prepare_s == 0.0  # unpacked once per digest
    in_use.add(first.digest)  # a sandbox holds it: never evicted
    second = store.prepare(sources[1])
    store.prepare(sources[2])  # over budget: the least recently used tree not in use goes
    assert first.rootfs.is_dir() and not second.rootfs.exists()
    assert store.prepare(sources[1]).prepare_s > 0  # comes back from its source on the next lease
    store.tag("named", Path(sources[0]))
    assert [i.name for i in store.list() if i.name] == ["named"]


@needs_bwrap
@as_root
def test_image_is_the_sandbox_root(tmp_path: Path, state_dir: Path) -> None:
    image = busybox_image(tmp_path / "img")

    async def scenario() -> None:
        backend = LocalBackend(BrokerSettings(state_dir=state_dir))
        await backend.start()
        spec = SandboxSpec(Template(name="bb", image=str(image)), Resources())
        one, two = await backend.create(spec), await backend.create(spec)
        assert one.workdir == "/testbed"

        async def sh(sandbox_id: str, command: str) -> str:
            result = await backend.exec(sandbox_id, ExecRequest(shell=command))
            assert result.exit_code == 0, result.stderr
            return result.stdout

        out = await sh(one.sandbox_id, 'id -un; pwd; echo "$FOO $HOME $PATH"; ls /testbed; ls /usr 2>&1 || true')
        lines = out.splitlines()
        assert lines[:4] == ["agent", "/testbed", "from-image /home/agent /bin", "a.txt"]
        assert "pkg" in lines and "No such file" in out  # the host's /usr is not there
        await sh(one.sandbox_id, "echo mine > /etc/note; rm a.txt")
        assert await sh(two.sandbox_id, "ls /etc; ls") == "group\nhosts\npasswd\na.txt\npkg\n"  # private uppers
        await backend.write_file(one.sandbox_id, "pkg/w.py", b"w")
        assert await backend.read_file(one.sandbox_id, "/testbed/pkg/w.py") == b"w"
        assert await backend.read_file(one.sandbox_id, "/etc/note") == b"mine\n"

        with_usr = SandboxSpec(Template(name="bb-usr", image=str(image), host_usr=True), Resources())
        three = await backend.create(with_usr)
        assert "python3" in await sh(three.sandbox_id, "ls /usr/bin")
        for sandbox in (one, two, three):
            await backend.destroy(sandbox.sandbox_id)
        assert overlay.mounts_under(state_dir) == []
        await backend.close()

    asyncio.run(scenario())


@needs_bwrap
@as_root
@pytest.mark.slow  # three broker starts
def test_started_and_stopped_twice_one_kill_9_leaves_no_mounts_and_a_store_within_budget(
    tmp_path: Path, state_dir: Path, start_broker: BrokerFactory
) -> None:
    """What ``make run`` twice does to the broker: a relative state dir, two images over a store
    budget smaller than both, a clean stop, a kill -9 with a sandbox mounted, a restart."""
    images = {"bb": busybox_image(tmp_path / "bb"), "calc": calc_repo_image(tmp_path / "calc")}
    relative = os.path.relpath(state_dir, REPO_ROOT)  # brokers run in the repository root
    budget_mb = 3  # each image's busybox layer takes ~2 MB unpacked: both do not fit
    env = {"ROLLOUT_BROKER_REAP_INTERVAL_S": "0.2", "ROLLOUT_BROKER_ORPHAN_INTERVAL_S": "0.5",
           "ROLLOUT_BROKER_IMAGE_STORE_MB": str(budget_mb)}  # fmt: skip
    for run_number in (1, 2):
        broker = start_broker("--state-dir", relative, env=env, instance=f"b{run_number}")
        with httpx.Client(base_url=broker.url, timeout=60) as client:
            held = []
            for name, image in images.items():
                assert client.post("/templates", json={"name": name, "image": str(image)}).status_code == 201
                held.append(lease(client, template=name, ttl_s=8))  # expires soon after a kill
                assert run(client, held[-1]["id"], "pwd")["stdout"] == "/testbed\n"
            assert overlay.mounts_under(state_dir)
            if run_number == 1:
                for item in held:
                    assert client.delete(f"/leases/{item['id']}").status_code == 204
        if run_number == 1:
            broker.stop(timeout_s=60)  # SIGTERM (a loaded CI machine may need more than 10 s)
            assert broker.proc.returncode != -signal.SIGKILL, "killed: its stop hung\n" + broker.log()[-2000:]
            _assert_clean(state_dir, budget_mb)
        else:
            broker.kill()  # SIGKILL: its sandboxes stay mounted
            assert overlay.mounts_under(state_dir)
    restarted = start_broker("--state-dir", relative, env=env, instance="b3")
    deadline = time.monotonic() + 60
    while (overlay.mounts_under(state_dir) or any((state_dir / "sandboxes").iterdir())) and time.monotonic() < deadline:
        time.sleep(0.2)  # the leases expire and the reaper destroys their sandboxes (unmounts, then removes)
    restarted.stop(timeout_s=60)  # its clean stop is what fits the store to its budget
    assert restarted.proc.returncode != -signal.SIGKILL, "killed: its stop hung\n" + restarted.log()[-2000:]
    _assert_clean(state_dir, budget_mb)
    assert list((state_dir / "images" / "trees").iterdir())  # an unpacked image stays, within budget


def _assert_clean(state_dir: Path, budget_mb: int) -> None:
    assert overlay.mounts_under(state_dir) == []  # /proc/self/mountinfo
    assert not list((state_dir / "sandboxes").iterdir())
    assert not list(state_dir.glob("overlay-probe-*")) and not list(state_dir.glob("*/.staging-*"))
    assert tree_size(state_dir / "images" / "trees") <= budget_mb * 2**20
