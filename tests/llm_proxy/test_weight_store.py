"""Weights between hosts: the trainer publishes an export into a weight store, each engine host
fetches it into its own disk and verifies the checksum before the engines switch. Three separate
directories stand for the trainer's disk, the shared store and the engine host's disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.engines.weight_store import StageError, stage
from services.protocol.weights import CHECKSUM_FILE, WeightUpdate, WeightUpdateResult, tree_checksum
from tests.llm_proxy.fleet import start_engines, start_proxy, wait_until
from trainer_client.weight_store import publish


def make_export(root: Path, version: str) -> tuple[Path, str]:
    """An export directory as the trainer writes it: files, then CHECKSUM."""
    path = root / f"v{version}"
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 64 + version.encode())
    files = sorted(p for p in path.iterdir())
    checksum = tree_checksum((p.name, [p.read_bytes()]) for p in files)
    (path / CHECKSUM_FILE).write_text(checksum + "\n")
    return path, checksum


def test_publish_and_stage_through_a_file_store(tmp_path: Path) -> None:
    export, checksum = make_export(tmp_path / "trainer", "1")
    location = publish(export, (tmp_path / "store").as_uri())
    assert location == (tmp_path / "store" / "v1").as_uri()
    staged = stage(location, checksum, tmp_path / "engine-host")
    assert staged.parent == tmp_path / "engine-host" and (staged / "model.safetensors").exists()
    assert stage(location, checksum, tmp_path / "engine-host") == staged  # staged once
    assert stage(str(export), checksum, tmp_path / "unused") == export  # a shared path is verified in place
    assert publish(export, None) == str(export)


def test_a_corrupted_or_missing_export_is_refused(tmp_path: Path) -> None:
    export, checksum = make_export(tmp_path / "trainer", "2")
    location = publish(export, (tmp_path / "store").as_uri())
    with (tmp_path / "store" / "v2" / "model.safetensors").open("r+b") as f:
        f.write(b"\xff")
    with pytest.raises(StageError, match="checksum mismatch"):
        stage(location, checksum, tmp_path / "engine-host")
    assert not list((tmp_path / "engine-host").iterdir())  # nothing half-staged is left
    with pytest.raises(StageError, match="no such directory"):
        stage((tmp_path / "store" / "v9").as_uri(), checksum, tmp_path / "engine-host")
    with pytest.raises(StageError, match="scheme"):
        stage("ftp://host/v2", checksum, tmp_path / "engine-host")


def _post(proxy: str, update: WeightUpdate) -> WeightUpdateResult:
    response = httpx.post(proxy + "/admin/weights", json=update.model_dump(), timeout=60)
    assert response.status_code == 200, response.text
    return WeightUpdateResult.model_validate(response.json())


def _info(url: str) -> dict[str, str]:
    return dict(httpx.get(url + "/get_model_info", timeout=10).json())


@pytest.mark.e2e
def test_engines_load_weights_written_on_another_host(tmp_path: Path, redis_url: str) -> None:
    store = tmp_path / "store"

    def damage(location: str) -> None:
        (store / "v2" / "config.json").write_text("{}")

    hosts_load_and_refuse(tmp_path, redis_url, store.as_uri(), damage)


def hosts_load_and_refuse(tmp_path: Path, redis_url: str, store_url: str, damage: Callable[[str], None]) -> None:
    """Two engine hosts (their own cache directory) load version 1 from the store through the proxy's
    transaction; version 2, damaged in the store by ``damage(location)``, is refused by every host."""
    logs, host_disk = tmp_path / "logs", tmp_path / "engine-host"
    base, base_urls = start_engines(logs, 1)
    proxy = start_proxy(logs, redis_url, base_urls)
    joined, urls = start_engines(
        logs, 2, "--proxy-url", proxy.url, "--pool", "hosts", "--weight-cache-dir", str(host_disk), name="hosts"
    )

    def status() -> dict[str, Any]:
        return dict(httpx.get(proxy.url + "/admin/status", timeout=10).json()["pools"])

    try:
        wait_until(lambda: len(status().get("hosts", {}).get("engines", [])) == 2, what="engines in pool hosts")
        export, checksum = make_export(tmp_path / "trainer", "1")
        location = publish(export, store_url)
        result = _post(proxy.url, WeightUpdate(pool="hosts", version="1", location=location, checksum=checksum))
        assert result.ok and not result.quarantined, result
        for url in urls:
            info = _info(url)
            assert info["weight_version"] == "1" and Path(info["model_path"]).is_relative_to(host_disk)

        bad, bad_checksum = make_export(tmp_path / "trainer", "2")
        location = publish(bad, store_url)
        damage(location)
        result = _post(proxy.url, WeightUpdate(pool="hosts", version="2", location=location, checksum=bad_checksum))
        assert not result.ok and not result.quarantined  # every host refused: the pool keeps version 1
        assert all("checksum mismatch" in str(e.error) for e in result.engines)
        assert status()["hosts"]["version"] == "1" and all(_info(u)["weight_version"] == "1" for u in urls)
    finally:
        for svc in (joined, proxy, base):
            svc.stop()
