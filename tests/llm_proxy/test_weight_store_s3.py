"""The weight store on a real S3 server (moto's server on loopback, spoken to over HTTP by boto3 in
the trainer's and the engine hosts' processes): the trainer uploads an export, engine hosts fetch it
with the checksum verified, and an object damaged in the bucket is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.engines.weight_store import StageError, stage
from services.runtime.net import free_port
from tests.llm_proxy.test_weight_store import hosts_load_and_refuse, make_export
from trainer_client.weight_store import publish

boto3 = pytest.importorskip("boto3", reason="the [s3] extra (boto3) is not installed")
moto_server = pytest.importorskip("moto.server", reason="moto[server] (the dev extra) is not installed")

BUCKET = "weights"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """An S3 server on 127.0.0.1 for the module."""
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A client of the server, with the environment boto3 reads in this process and its children."""
    env = {
        "AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def test_publish_to_s3_and_stage_with_the_checksum_verified(tmp_path: Path, s3: Any) -> None:
    export, checksum = make_export(tmp_path / "trainer", "1")
    location = publish(export, f"s3://{BUCKET}/runs/a")
    assert location == f"s3://{BUCKET}/runs/a/v1"
    stored = {obj["Key"] for obj in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert stored == {f"runs/a/v1/{p.name}" for p in export.iterdir()}
    staged = stage(location, checksum, tmp_path / "engine-host")
    assert staged.parent == tmp_path / "engine-host"
    assert (staged / "model.safetensors").read_bytes() == (export / "model.safetensors").read_bytes()


def test_a_corrupted_or_missing_s3_object_is_refused(tmp_path: Path, s3: Any) -> None:
    export, checksum = make_export(tmp_path / "trainer", "2")
    location = publish(export, f"s3://{BUCKET}/runs/b")
    body = bytearray((export / "model.safetensors").read_bytes())
    body[100] ^= 0xFF  # one flipped byte in the bucket
    s3.put_object(Bucket=BUCKET, Key="runs/b/v2/model.safetensors", Body=bytes(body))
    with pytest.raises(StageError, match="checksum mismatch"):
        stage(location, checksum, tmp_path / "engine-host")
    assert not list((tmp_path / "engine-host").iterdir())  # nothing half-staged is left
    with pytest.raises(StageError, match="nothing stored"):
        stage(f"s3://{BUCKET}/runs/none/v2", checksum, tmp_path / "engine-host")


@pytest.mark.e2e
@pytest.mark.slow
def test_engine_hosts_load_weights_from_s3(tmp_path: Path, redis_url: str, s3: Any) -> None:
    """Engine processes fetch from the bucket (their own boto3, the same environment) into their own
    cache directory during the proxy's weight transaction; a damaged object fails every host."""

    def damage(location: str) -> None:
        key = location.removeprefix(f"s3://{BUCKET}/") + "/config.json"
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"{}")

    hosts_load_and_refuse(tmp_path, redis_url, f"s3://{BUCKET}/runs/c", damage)
