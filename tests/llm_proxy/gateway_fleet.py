"""A scripted engine and a proxy as real processes, and gateway sessions written as a worker would."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from services.protocol import keys
from services.protocol.gateway import GatewayCall, GatewaySession, decode_call, new_session_token, token_digest
from services.runtime.chat import ChatTemplate
from services.runtime.tokenizer import write_tokenizer_dir
from tests.support.processes import ServiceProcess, start_service

if TYPE_CHECKING:  # the SDKs are imported by the tests that use them: 2 s of every xdist worker's collection
    import anthropic
    import openai


@dataclass
class GatewayFleet:
    proxy: ServiceProcess
    engine: ServiceProcess
    redis: redis.Redis
    chat: ChatTemplate
    clients: list[openai.OpenAI | anthropic.Anthropic] = field(default_factory=list)

    def openai(self, sid: str, token: str) -> openai.OpenAI:
        import openai

        client = openai.OpenAI(base_url=self.openai_url(sid), api_key=token, max_retries=0)
        self.clients.append(client)
        return client

    def anthropic(self, sid: str, token: str) -> anthropic.Anthropic:
        import anthropic

        client = anthropic.Anthropic(base_url=self.anthropic_url(sid), api_key=token, max_retries=0)
        self.clients.append(client)
        return client

    def session(self, **caps: Any) -> tuple[str, str]:
        """A fresh session (id, token) with generous caps unless overridden."""
        sid, token = secrets.token_hex(8), new_session_token()
        fields: dict[str, Any] = {"max_turns": 20, "max_tokens_per_turn": 400, "max_trajectory_tokens": 20_000} | caps
        record = GatewaySession(
            session=sid,
            token_sha256=token_digest(token),
            job="job",
            trajectory_id=f"t-{sid}",
            attempt=1,
            pool="default",
            expires_at=time.time() + 300,
            **fields,
        )
        self.redis.set(keys.gateway_session(sid), record.model_dump_json())
        return sid, token

    def openai_url(self, sid: str) -> str:
        return f"{self.proxy.url}/e/{sid}/v1"

    def anthropic_url(self, sid: str) -> str:
        return f"{self.proxy.url}/e/{sid}"

    def calls(self, sid: str) -> list[GatewayCall]:
        raw: list[bytes] = self.redis.lrange(keys.gateway_calls(sid), 0, -1)  # type: ignore[assignment]
        return [decode_call(item) for item in raw]

    def state(self, sid: str) -> dict[str, str]:
        raw: dict[bytes, bytes] = self.redis.hgetall(keys.gateway_state(sid))  # type: ignore[assignment]
        return {k.decode(): v.decode() for k, v in raw.items()}


@contextmanager
def gateway_fleet(redis_url: str, tmp: Path, rules: dict[str, list[str]], *proxy_args: str) -> Iterator[GatewayFleet]:
    model = write_tokenizer_dir(tmp / "tokenizer")
    script = tmp / "script.json"
    doc = {"rules": [{"match": m, "replies": r} for m, r in rules.items()], "default": "I am done."}
    script.write_text(json.dumps(doc))
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    engine = start_service(
        [
            "-m",
            "services.cli",
            "engine",
            "--mode",
            "scripted",
            "--script",
            str(script),
            "--model-path",
            str(model),
            "--port",
            "{port}",
        ],
        log_dir=logs,
        health_path="/health",
        name="engine",
    )
    try:
        proxy = start_service(
            [
                "-m",
                "services.cli",
                "proxy",
                "--port",
                "{port}",
                "--workers",
                "1",
                "--engines",
                engine.url,
                "--gateway-tokenizers",
                f"default={model}",
                *proxy_args,
            ],
            log_dir=logs,
            # every proxy authenticates its admin API; gateway sessions carry their own tokens
            env={
                "ROLLOUT_REDIS_URL": redis_url,
                "ROLLOUT_ADMIN_TOKEN": secrets.token_hex(16),
                "ROLLOUT_SERVICE_TOKEN": secrets.token_hex(16),
            },  # fmt: skip
            name="proxy",
        )
    except BaseException:
        engine.stop()
        raise
    client = redis.Redis.from_url(redis_url)
    fleet = GatewayFleet(proxy, engine, client, ChatTemplate.from_dir(model))
    try:
        yield fleet
    finally:
        for sdk in fleet.clients:
            sdk.close()
        client.close()
        proxy.stop()
        engine.stop()
