"""The lean lease, exec, renew and release routes (``hot_routes.py``) answer as the FastAPI routes
did: the same bodies, the same checks of the caller and the same error codes. In-process: the real
routes, error handlers and authenticator over real Redis, a broker that records what it is asked."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from services.protocol import keys
from services.protocol.errors import PlatformError
from services.protocol.sandboxes import ExecRequest, ExecResult, Lease, LeaseBatchResult, LeaseRequest, RenewedLeases
from services.protocol.status import ErrorCode
from services.runtime.auth import Authenticator, TokenSet, hash_token
from services.runtime.http_errors import install_error_handlers
from services.sandbox_broker import hot_routes
from services.sandbox_broker.auth import Callers
from services.sandbox_broker.metrics import BrokerMetrics

SERVICE, JOB_A = "svc", "tok-a"


class RecordingBroker:
    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        self.calls: list[tuple[str, Any]] = []
        self._metrics = BrokerMetrics()

    async def create_lease(self, request: LeaseRequest) -> Lease:
        self.calls.append(("create", request))
        if request.template == "missing":
            raise PlatformError(ErrorCode.UNKNOWN_TEMPLATE, "no template 'missing'", field="template")
        if request.template == "broken":
            raise RuntimeError("a bug")
        lease = Lease(id=f"lse-{len(self.leases)}", template=request.template, backend="local", job=request.job,
                      sandbox_id="s", expires_at=time.time() + request.ttl_s, warm=True, start_s=0.001)  # fmt: skip
        self.leases[lease.id] = lease
        return lease

    async def warm_lease(self, request: LeaseRequest) -> Lease | None:
        """As ``create_lease``, but None (no warm sandbox ready) for the template "cold"."""
        return None if request.template == "cold" else await self.create_lease(request)

    @property
    def metrics(self) -> BrokerMetrics:
        return self._metrics

    async def get(self, lease_id: str) -> Lease:
        if lease_id not in self.leases:
            raise PlatformError(ErrorCode.LEASE_NOT_FOUND, f"no live lease {lease_id}")
        return self.leases[lease_id]

    async def release(self, lease_id: str) -> bool:
        self.calls.append(("release", lease_id))
        return self.leases.pop(lease_id, None) is not None

    async def exec(self, lease_id: str, request: ExecRequest) -> ExecResult:
        await self.get(lease_id)
        self.calls.append(("exec", request))
        return ExecResult(exit_code=0, stdout="hi\n", stderr="", duration_s=0.001)

    async def renew(self, lease_id: str, ttl_s: float) -> Lease:
        lease = (await self.get(lease_id)).model_copy(update={"expires_at": time.time() + ttl_s})
        self.calls.append(("renew", lease_id))
        self.leases[lease_id] = lease
        return lease

    async def renew_many(self, lease_ids: list[str], ttl_s: float, visible: Callable[[Lease], bool]) -> RenewedLeases:
        self.calls.append(("renew_many", lease_ids))
        shown = [i for i in lease_ids if i in self.leases and visible(self.leases[i])]
        renewed = RenewedLeases(expires_at={i: (await self.renew(i, ttl_s)).expires_at for i in shown})
        renewed.ended = [i for i in lease_ids if i not in renewed.expires_at]
        return renewed


@pytest.fixture
async def http(redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, RecordingBroker]]:
    client = aioredis.Redis.from_url(redis_url)
    await client.hset(keys.job_tokens(), hash_token(JOB_A), "a")
    app = FastAPI()
    install_error_handlers(app)
    hot_routes.install(app)

    @app.get("/leases/{lease_id}")
    async def other_route(lease_id: str) -> dict[str, str]:  # a FastAPI route: reached through the front
        return {"fastapi": lease_id}

    broker = RecordingBroker()
    app.state.broker, app.state.redis = broker, client
    app.state.auth = Callers(Authenticator(TokenSet(), TokenSet.parse(SERVICE)))  # as create_app sets it
    transport = httpx.ASGITransport(app=hot_routes.Front(app))  # as served (main.py)
    async with httpx.AsyncClient(transport=transport, base_url="http://broker") as http:
        yield http, broker
    await client.aclose()


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_lease_exec_release_answer_the_protocols_bodies(http: tuple[httpx.AsyncClient, Any]) -> None:
    client, broker = http
    created = await client.post("/leases", json={"ttl_s": 30, "job": "j"}, headers=_as(SERVICE))
    assert created.status_code == 201
    lease = Lease.model_validate_json(created.content)
    assert lease.job == "j" and broker.calls[0] == ("create", LeaseRequest(ttl_s=30, job="j"))
    ran = await client.post(f"/leases/{lease.id}/exec", json={"argv": ["true"]}, headers=_as(SERVICE))
    assert ran.status_code == 200 and ran.headers["content-type"] == "application/json"
    assert ExecResult.model_validate_json(ran.content).stdout == "hi\n"
    assert broker.calls[1] == ("exec", ExecRequest(argv=["true"]))
    released = await client.delete(f"/leases/{lease.id}", headers=_as(SERVICE))
    assert released.status_code == 204 and released.content == b""


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/exec", {"shell": 5}, "shell"),
        ("/exec", {"shell": "true", "timeout_s": 0}, "timeout_s"),
        ("/exec", {"argv": []}, "argv"),
        ("", {"ttl_s": 0}, "ttl_s"),
        ("", {"resources": {"cpus": 1e-9}}, "resources.cpus"),  # under the backends' minimum (0.01)
        ("", {"network": "host"}, "network"),
    ],
)
async def test_an_invalid_body_is_422_naming_its_field(
    http: tuple[httpx.AsyncClient, Any], path: str, body: dict[str, Any], field: str
) -> None:
    client, broker = http
    lease_id = (await broker.create_lease(LeaseRequest())).id
    url = f"/leases/{lease_id}{path}" if path else "/leases"
    answer = await client.post(url, json=body, headers=_as(SERVICE))
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "validation_error" and answer.json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("content", "content_type"),
    [(b"{", "application/json"), (b"", "application/json"), (b'{"shell": "true"}', "text/plain"), (b"[]", None)],
)
async def test_a_body_that_is_not_a_json_object_is_422(
    http: tuple[httpx.AsyncClient, Any], content: bytes, content_type: str | None
) -> None:
    client, broker = http
    lease_id = (await broker.create_lease(LeaseRequest())).id
    headers = {**_as(SERVICE), **({"content-type": content_type} if content_type else {})}
    answer = await client.post(f"/leases/{lease_id}/exec", content=content, headers=headers)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "validation_error"
    assert [c for c in broker.calls if c[0] == "exec"] == []


async def test_callers_are_checked_as_before(http: tuple[httpx.AsyncClient, Any]) -> None:
    client, broker = http
    other = (await broker.create_lease(LeaseRequest(job="b"))).id
    for method, url in (("POST", "/leases"), ("POST", f"/leases/{other}/exec"), ("DELETE", f"/leases/{other}")):
        anonymous = await client.request(method, url, json={"shell": "true"})
        assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "unauthorized"
        wrong = await client.request(method, url, json={"shell": "true"}, headers=_as("nope"))
        assert wrong.status_code == 401
    for method, url in (("POST", f"/leases/{other}/exec"), ("DELETE", f"/leases/{other}")):
        hidden = await client.request(method, url, json={"shell": "true"}, headers=_as(JOB_A))
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "lease_not_found"
    assert other in broker.leases and [c for c in broker.calls if c[0] != "create"] == []
    own = await client.post("/leases", json={}, headers=_as(JOB_A))
    assert own.status_code == 201 and own.json()["job"] == "a"  # a job token leases for its own job
    foreign = await client.post("/leases", json={"job": "b"}, headers=_as(JOB_A))
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "forbidden"
    mine = await client.post(f"/leases/{own.json()['id']}/exec", json={"shell": "true"}, headers=_as(JOB_A))
    assert mine.status_code == 200


async def test_other_requests_reach_the_fastapi_app(http: tuple[httpx.AsyncClient, Any]) -> None:
    client, _ = http
    assert (await client.get("/leases/x")).json() == {"fastapi": "x"}
    wrong_method = await client.get("/leases/x/exec")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    unknown = await client.post("/nowhere", json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"


async def test_renewals_one_by_one_and_many_at_once(http: tuple[httpx.AsyncClient, Any]) -> None:
    client, broker = http
    mine, theirs = (
        (await broker.create_lease(LeaseRequest(job="a"))).id,
        (await broker.create_lease(LeaseRequest(job="b"))).id,
    )
    one = await client.post(f"/leases/{mine}/renew", json={"ttl_s": 900}, headers=_as(SERVICE))
    assert one.status_code == 200 and Lease.model_validate_json(one.content).expires_at > time.time() + 800
    missing = await client.post("/leases/lse-x/renew", json={"ttl_s": 900}, headers=_as(SERVICE))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "lease_not_found"
    hidden = await client.post(f"/leases/{theirs}/renew", json={"ttl_s": 900}, headers=_as(JOB_A))
    assert hidden.status_code == 404  # another job's lease, as one that does not exist
    ids = [mine, theirs, "lse-x"]
    every = await client.post("/leases/renew", json={"ids": ids, "ttl_s": 900}, headers=_as(SERVICE))
    assert every.status_code == 200, every.text
    assert set(every.json()["expires_at"]) == {mine, theirs} and every.json()["ended"] == ["lse-x"]
    own = await client.post("/leases/renew", json={"ids": ids}, headers=_as(JOB_A))
    assert list(own.json()["expires_at"]) == [mine] and own.json()["ended"] == [theirs, "lse-x"]
    for headers in ({}, _as("nope")):
        refused = await client.post("/leases/renew", json={"ids": ids}, headers=headers)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    invalid_bodies: list[dict[str, Any]] = [{"ids": "x"}, {"ids": ids, "ttl_s": -1}, {}]
    for body in invalid_bodies:
        invalid = await client.post("/leases/renew", json=body, headers=_as(SERVICE))
        assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "validation_error", body
    assert [c[1] for c in broker.calls if c[0] == "renew_many"] == [ids, ids]


async def test_a_batch_answers_one_outcome_per_lease_in_order(http: tuple[httpx.AsyncClient, Any]) -> None:
    client, broker = http
    asked = [{"job": "j", "ttl_s": 30}, {"template": "missing"}, {"template": "broken"}, {"job": "k"}]
    answer = await client.post("/leases/batch", json={"leases": asked}, headers=_as(SERVICE))
    assert answer.status_code == 200, answer.text
    results = LeaseBatchResult.model_validate_json(answer.content).results
    assert [r.lease.job if r.lease else None for r in results] == ["j", None, None, "k"]
    assert results[0].lease is not None and results[0].lease.expires_at < time.time() + 31
    assert results[1].error is not None and results[1].error.code == ErrorCode.UNKNOWN_TEMPLATE
    assert results[1].error.field == "template"
    assert results[2].error is not None and results[2].error.code == ErrorCode.INTERNAL_ERROR
    assert broker.metrics.errors.labels("unknown_template")._value.get() == 1
    assert len(broker.leases) == 2  # each made lease is a live one, answered


async def test_a_warm_only_batch_answers_warm_miss_for_a_lease_with_no_warm_sandbox(
    http: tuple[httpx.AsyncClient, Any],
) -> None:
    client, broker = http
    asked = [{"job": "j"}, {"template": "cold"}, {"template": "missing"}]
    answer = await client.post("/leases/batch", json={"leases": asked, "warm_only": True}, headers=_as(SERVICE))
    assert answer.status_code == 200, answer.text
    hit, miss, missing = LeaseBatchResult.model_validate_json(answer.content).results
    assert hit.lease is not None and miss.lease is None and missing.error is not None
    assert miss.error is not None and miss.error.code == ErrorCode.WARM_MISS and not miss.error.infra
    assert missing.error.code == ErrorCode.UNKNOWN_TEMPLATE  # a refusal is still its own error
    assert broker.metrics.warm_misses._value.get() == 1  # counted apart from the errors
    assert broker.metrics.errors.labels("warm_miss")._value.get() == 0
    assert [c[1].template for c in broker.calls if c[0] == "create"] == ["default", "missing"]
    invalid = await client.post("/leases/batch", json={"leases": asked, "warm_only": "x"}, headers=_as(SERVICE))
    assert invalid.status_code == 422


async def test_a_batch_is_refused_whole_for_a_bad_caller_or_body(http: tuple[httpx.AsyncClient, Any]) -> None:
    client, broker = http
    for headers, status in (({}, 401), (_as(JOB_A), 403)):  # job a asking for job b's lease
        refused = await client.post("/leases/batch", json={"leases": [{}, {"job": "b"}]}, headers=headers)
        assert refused.status_code == status, refused.text
    bodies: list[dict[str, Any]] = [{"leases": []}, {"leases": [{"ttl_s": 0}]}, {}, {"leases": [{}] * 1025}]
    for body in bodies:
        invalid = await client.post("/leases/batch", json=body, headers=_as(SERVICE))
        assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "validation_error"
    assert broker.calls == []  # nothing was leased
    own = await client.post("/leases/batch", json={"leases": [{}]}, headers=_as(JOB_A))
    assert own.json()["results"][0]["lease"]["job"] == "a"  # a job token's own job where left out


@pytest.mark.parametrize(
    ("method", "path", "route"),
    [
        ("POST", "/leases", "create_lease"), ("POST", "/leases/renew", "renew_many"),
        ("POST", "/leases/batch", "create_leases"), ("GET", "/leases/batch", None),
        ("DELETE", "/leases/l1", "release"), ("DELETE", "/leases/renew", "release"),
        ("POST", "/leases/l1/exec", "exec_"), ("POST", "/leases/l1/renew", "renew"),
        ("GET", "/leases", None), ("GET", "/leases/l1", None), ("POST", "/leases/l1", None),
        ("POST", "/leases/", None), ("DELETE", "/leases//exec", None), ("POST", "/leases/l1/exec/", None),
        ("POST", "/leases/l1/exec/stream", None), ("POST", "/leasesx", None), ("PUT", "/leases/l1/files", None),
    ],
)  # fmt: skip
def test_only_the_hot_routes_are_taken_by_the_front(method: str, path: str, route: str | None) -> None:
    found = hot_routes.match(method, path)
    assert (found[0].__name__ if found else None) == route


async def test_the_settings_tokens_are_remembered_job_tokens_never(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    callers = Callers(Authenticator(TokenSet(), TokenSet.parse(SERVICE)))
    try:
        await client.hset(keys.job_tokens(), hash_token(JOB_A), "a")
        assert (await callers.resolve(client, f"Bearer {SERVICE}")).role == "service"
        assert (await callers.resolve(client, f"Bearer {JOB_A}")).job == "a"
        assert list(callers._known) == [f"Bearer {SERVICE}"]
        await client.hdel(keys.job_tokens(), hash_token(JOB_A))  # the rollout API revoked it
        for header in (f"Bearer {JOB_A}", "Bearer nope", None):
            with pytest.raises(PlatformError) as refused:
                await callers.resolve(client, header)
            assert refused.value.code == ErrorCode.UNAUTHORIZED
        assert (await callers.resolve(None, f"Bearer {SERVICE}")).role == "service"  # from memory: no Redis
        assert list(callers._known) == [f"Bearer {SERVICE}"]
    finally:
        await client.aclose()
