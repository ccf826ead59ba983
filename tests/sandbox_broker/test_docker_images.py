"""Task images named by a host path on the docker backend: an OCI image layout and a ``docker save``
tar are loaded into a real (private) dockerd and run as they are (layers, whiteouts, Env, WorkingDir)."""

from __future__ import annotations

from pathlib import Path

import docker
import httpx
import pytest

from services.sandbox_broker.images.archive import write_oci_layout
from services.sandbox_broker.images.sources import ImageConfig, open_source
from tests.sandbox_broker.conftest import BrokerFactory, docker_env, lease, run
from tests.sandbox_broker.dockerd import Dockerd
from tests.sandbox_broker.images_support import busybox_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_image_paths_are_loaded_into_docker_once(dockerd: Dockerd, start_broker: BrokerFactory, tmp_path: Path) -> None:
    archive = busybox_image(tmp_path / "img", user="root")
    config = ImageConfig(env=("PATH=/bin", "FOO=from-oci"), workdir="/testbed")
    layers = [tmp_path / "img" / "l1.tar", tmp_path / "img" / "l2.tar"]
    layout = tmp_path / "oci"
    write_oci_layout(layout, layers, config, tmp_path / "blobs")
    (tmp_path / "rootdir").mkdir()
    broker = start_broker("--backend", "docker", env=docker_env(dockerd))
    engine = docker.DockerClient(base_url=dockerd.url)
    with httpx.Client(base_url=broker.url, timeout=120) as client:
        for name, path, foo in (("bb-tar", archive, "from-image"), ("bb-oci", layout, "from-oci")):
            assert client.post("/templates", json={"name": name, "image": str(path)}).status_code == 201
            held = lease(client, template=name)
            out = run(client, held["id"], 'ls; ls pkg; echo "$FOO"', cwd="/testbed")
            assert out["stdout"] == f"a.txt\npkg\nnew.py\n{foo}\n"  # b.txt and pkg/old.py whited out
            assert engine.images.get(open_source(path).digest)  # run by its config digest
            assert client.delete(f"/leases/{held['id']}").status_code == 204
        loaded = len(engine.images.list())
        again = lease(client, template="bb-oci")  # already in the engine: not loaded again
        assert len(engine.images.list()) == loaded
        assert client.delete(f"/leases/{again['id']}").status_code == 204

        assert client.post("/templates", json={"name": "dir", "image": str(tmp_path / "rootdir")}).status_code == 201
        refused = client.post("/leases", json={"template": "dir"})
        assert refused.status_code == 400 and "not an image docker can load" in refused.text
    engine.close()
