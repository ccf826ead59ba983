"""One gateway call's order against a real Redis (the engine call stubbed): the answer is built while
the record is in flight and returned only once the call is recorded; a failed record fails the call."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import ResponseError

from services.llm_proxy.gateway.engine import EngineAnswer
from services.llm_proxy.gateway.metrics import GatewayMetrics
from services.llm_proxy.gateway.sessions import SessionStore
from services.llm_proxy.gateway.turns import TurnRequest, TurnResult, Turns
from services.protocol import keys
from services.protocol.gateway import GatewaySession, token_digest
from services.runtime.chat import ChatTemplate, bundled_chat_template
from services.runtime.redis_pool import open_redis


class _Pools:
    chat = bundled_chat_template()

    def template(self, pool: str) -> ChatTemplate:
        return self.chat

    def local(self, pool: str) -> bool:
        return True

    def parser(self, pool: str) -> str:
        return "hermes"

    def routed_experts(self, pool: str) -> None:
        return None


async def _engine(*args: Any) -> EngineAnswer:
    ids = [*_Pools.chat.encode("fine"), _Pools.chat.eos_id]
    return EngineAnswer(output_ids=ids, logprobs=[0.0] * len(ids), top_logprobs=[], finish_reason="stop",
                        weight_version="1", engine_id="e", prompt_tokens=0, cached_tokens=0, llm_s=0.0,
                        routed_experts=None)  # fmt: skip


async def test_the_answer_is_built_while_recording_and_returned_once_recorded(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SessionStore(open_redis(redis_url))
    turns = Turns(None, store, _Pools(), GatewayMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    monkeypatch.setattr(turns, "_engine", _engine)
    session = GatewaySession(
        session=secrets.token_hex(8), token_sha256=token_digest("t"), job="j", trajectory_id="t", attempt=1,
        pool="default", expires_at=time.time() + 300, max_turns=10, max_tokens_per_turn=8, max_trajectory_tokens=999,
    )  # fmt: skip
    turn = TurnRequest(route="chat", messages=[{"role": "user", "content": "hi"}], tools=None, prompt=None,
                       max_tokens=None)  # fmt: skip
    events: list[str] = []
    recorded = store.record

    async def record(*args: Any, **kwargs: Any) -> None:
        events.append("record sent")
        await recorded(*args, **kwargs)
        events.append("recorded")

    def answer(result: TurnResult) -> str:
        events.append("answer built")
        return result.text

    monkeypatch.setattr(store, "record", record)
    try:
        assert await turns.run(None, session, turn, answer) == "fine"  # type: ignore[arg-type]
        assert events == ["record sent", "answer built", "recorded"]
        assert await store.redis.llen(keys.gateway_calls(session.session)) == 1

        async def failing(*args: Any, **kwargs: Any) -> None:
            raise ResponseError("the record failed")

        monkeypatch.setattr(store, "record", failing)
        events.clear()
        with pytest.raises(ResponseError, match="the record failed"):
            await turns.run(None, session, turn, answer)  # type: ignore[arg-type]
        assert events == ["answer built"]  # built, but the call fails: the agent never gets it
    finally:
        await store.redis.aclose(close_connection_pool=True)
