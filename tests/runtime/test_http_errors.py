"""One error installer for the FastAPI services: the same code gets the same status and body from
the API and the broker; Redis failures are 503 + Retry-After; no exception text leaks."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from services.protocol import ErrorCode, PlatformError
from services.rollout_api.app import create_app as create_api
from services.rollout_api.settings import ApiSettings
from services.runtime.http_errors import install_error_handlers
from services.runtime.net import free_port
from services.sandbox_broker.app import create_app as create_broker
from services.sandbox_broker.settings import BrokerSettings


class Body(BaseModel):
    ttl_s: float = Field(gt=0)


def tiny_app(seen: list[ErrorCode]) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app, seen.append)
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nothing listens there

    @app.post("/body")
    def body(b: Body) -> dict[str, float]:
        return {"ttl_s": b.ttl_s}

    @app.get("/quota")
    def quota() -> None:
        raise PlatformError(ErrorCode.QUOTA_EXCEEDED, "job full", retry_after_s=2.5)

    @app.get("/redis")
    def redis_down() -> None:
        dead.ping()

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret-path /etc/shadow")

    return app


def test_every_error_is_an_error_body_with_the_codes_status() -> None:
    seen: list[ErrorCode] = []
    with TestClient(tiny_app(seen), raise_server_exceptions=False) as client:
        invalid = client.post("/body", json={"ttl_s": -1})
        assert invalid.status_code == 422
        assert invalid.json()["error"]["code"] == "validation_error" and invalid.json()["error"]["field"] == "ttl_s"
        full = client.get("/quota")
        assert (full.status_code, full.headers["retry-after"]) == (429, "2")
        assert full.json()["error"]["retry_after_s"] == 2.5
        away = client.get("/redis")
        assert (away.status_code, away.headers["retry-after"]) == (503, "2")
        assert away.json()["error"]["code"] == "store_unavailable" and away.json()["error"]["infra"] is True
        boom = client.get("/boom")
        assert boom.status_code == 500 and "secret" not in boom.text
        assert boom.json()["error"] == {"code": "internal_error", "message": "internal error", "infra": True,
                                        "field": None, "retry_after_s": None}  # fmt: skip
        missing = client.get("/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        wrong = client.delete("/quota")
        assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "bad_request"
    assert seen == [ErrorCode.VALIDATION_ERROR, ErrorCode.QUOTA_EXCEEDED, ErrorCode.STORE_UNAVAILABLE,
                    ErrorCode.INTERNAL_ERROR, ErrorCode.NOT_FOUND, ErrorCode.BAD_REQUEST]  # fmt: skip


@pytest.mark.parametrize("which", ["api", "broker"])
def test_the_api_and_the_broker_install_the_same_handlers(which: str, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    broker = BrokerSettings(state_dir=tmp_path, admin_token="a", service_token="s")  # the broker needs its tokens
    app = create_api(ApiSettings(), url) if which == "api" else create_broker(broker, url)
    for kind in (PlatformError, redis.ConnectionError, Exception):
        assert app.exception_handlers[kind].__qualname__.startswith("install_error_handlers."), kind
