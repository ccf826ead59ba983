"""Weight notices: an export is posted to the proxy's /admin/weights and the verdict read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_client.weights import WeightPublisher
from tests.trainer.fake_fleet import serve_fleet
from trainer_client.export import Export, directory_checksum

pytestmark = [pytest.mark.trainer]


def fake_export(root: Path, version: str) -> Export:
    path = root / f"v{version}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights " + version.encode())
    return Export(version=version, path=path, checksum=directory_checksum(path), seconds=0.0)


def test_publish_and_verdict(tmp_path: Path, redis_url: str) -> None:
    with serve_fleet(redis_url) as (url, state):
        publisher = WeightPublisher(url, pool="default")
        try:
            good = publisher.publish(fake_export(tmp_path, "1"))
            assert good.ok and good.result is not None and good.result.version == "1" and state.version == "1"
            assert state.updates[0].checksum == directory_checksum(tmp_path / "v1")
            torn = fake_export(tmp_path, "2")
            (torn.path / "model.safetensors").write_bytes(b"half written")  # the checksum no longer matches
            bad = publisher.publish(torn)
            assert not bad.ok and state.version == "1"
            state.fail_weights = True
            refused = publisher.publish(fake_export(tmp_path, "3"))
            assert not refused.ok and refused.error == "HTTP 503"
        finally:
            publisher.close()


def test_unreachable_proxy_is_a_failed_sync(tmp_path: Path) -> None:
    from services.runtime.net import free_port

    publisher = WeightPublisher(f"http://127.0.0.1:{free_port()}", pool="default", timeout_s=2)
    outcome = publisher.publish(fake_export(tmp_path, "1"))
    publisher.close()
    assert not outcome.ok and outcome.error
