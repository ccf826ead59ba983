"""The proxy's own protocol for data-plane calls (``lean_server.py``): which requests it takes, and,
against a real proxy and engines, a connection that it serves and then hands to aiohttp, pipelined
calls, what it leaves to aiohttp (chunked bodies, streams, oversized and ambiguous requests) and its
idle keep-alive close."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import orjson
import pytest
from aiohttp import web

from services.llm_proxy.client_limits import ClientGuard
from services.llm_proxy.data_plane import DataPlane
from services.llm_proxy.lean_server import LeanServer, answer_bytes, parse_head
from services.llm_proxy.metrics import ProxyMetrics
from services.runtime.redis_server import EmbeddedRedis
from services.runtime.slow_clients import ClientLimits
from tests.llm_proxy.fleet import DEV_ENV, start_engines
from tests.llm_proxy.gateway_fleet import gateway_fleet
from tests.support.processes import ServiceProcess, start_service
from tests.support.slowloris import metric

HEAD = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pool: default\r\nContent-Length: 12"


def test_a_plain_call_is_taken_with_its_headers() -> None:
    path, headers, length, close, gateway = parse_head(HEAD)  # type: ignore[misc]
    assert (path, length, close, gateway) == ("/generate", 12, False, None)
    assert headers.get("x-pool") == headers.get("X-Pool") == "default" and headers["content-type"] == "application/json"
    assert parse_head(HEAD + b"\r\nConnection: close") is not None
    assert parse_head(HEAD + b"\r\nConnection: close")[3] is True  # type: ignore[index]
    assert parse_head(HEAD.replace(b"/generate", b"/v1/chat/completions")) is not None
    gateway = parse_head(HEAD.replace(b"/generate", b"/e/ab12-_Z/v1/messages"))
    assert gateway is not None and gateway[4] == ("ab12-_Z", "/v1/messages")


@pytest.mark.parametrize(
    "head",
    [
        HEAD.replace(b"POST", b"PUT"),
        HEAD.replace(b"HTTP/1.1", b"HTTP/1.0"),
        HEAD.replace(b"/generate", b"/generate?x=1"),
        HEAD.replace(b"/generate", b"/admin/weights"),
        HEAD.replace(b"/generate", b"/e/s1/v1/messages?beta=true"),
        HEAD.replace(b"/generate", b"/e/s.1/v1/chat/completions"),
        HEAD.replace(b"/generate", b"/e/s1/v1/messages/count_tokens"),
        HEAD.replace(b"/generate", b"/e//v1/chat/completions"),
        HEAD + b"\r\nContent-Length: 12",  # twice: smuggling's first step
        HEAD + b"\r\ncontent-length: 99",  # the same name in another case
        HEAD.replace(b"Content-Length: 12", b"Content-Length: +12"),
        HEAD.replace(b"Content-Length: 12", b"Content-Length: 1 2"),
        HEAD.replace(b"Content-Length: 12", "Content-Length: 1\u00b2".encode("latin-1")),
        HEAD.replace(b"\r\nContent-Length: 12", b""),
        HEAD + b"\r\nTransfer-Encoding: chunked",
        HEAD + b"\r\nExpect: 100-continue",
        HEAD + b"\r\nUpgrade: websocket",
        HEAD + b"\r\nConnection: upgrade",
        HEAD + b"\r\n folded continuation",
        HEAD + b"\r\nX-Bad: a\nb",
        HEAD + b"\r\nX-Bad: a\x00b",
        HEAD + b"\r\nNo colon here",
        HEAD + b"\r\nBad Name: v",
    ],
)
def test_anything_unusual_is_left_to_aiohttp(head: bytes) -> None:
    assert parse_head(head) is None


def test_an_answer_is_written_whole_and_never_with_a_broken_header() -> None:
    response = web.Response(body=b'{"a":1}', status=200, content_type="application/json", headers={"X-Engine-Id": "e"})
    raw = answer_bytes(response, close=True)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert body == b'{"a":1}' and head.startswith(b"HTTP/1.1 200 OK\r\nDate: ")
    assert b"\r\nContent-Length: 7\r\n" in head and b"\r\nConnection: close" in head and b"X-Engine-Id: e" in head
    injected = web.Response(body=b"{}", headers={"X-Weight-Version": "v1\r\nSet-Cookie: a=b"})
    with pytest.raises(ValueError, match="line break"):
        answer_bytes(injected, close=False)


@pytest.fixture(scope="module")
def proxy(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    logs = tmp_path_factory.mktemp("lean-logs")
    engines, urls = start_engines(logs, 2)
    env = {"ROLLOUT_REDIS_URL": redis_server.url, "ROLLOUT_PROXY_HTTP_KEEPALIVE_S": "1", **DEV_ENV}
    service = start_service(
        ["-m", "services.cli", "proxy", "--port", "{port}", "--workers", "1", "--engines", ",".join(urls),
         "--max-body-bytes", "4096"], log_dir=logs, env=env, name="proxy",
    )  # fmt: skip
    yield service
    service.stop()
    engines.stop()


def _call(body: dict[str, object], path: bytes = b"/generate", extra: bytes = b"") -> bytes:
    raw = orjson.dumps(body)
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (path, len(raw), extra, raw)


def _answers(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Read ``count`` answers with a ``Content-Length`` body (or a chunked one, read to its end)."""
    data, answers = b"", list[tuple[int, dict[str, str], bytes]]()
    sock.settimeout(30)
    while len(answers) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            lines = data[:end].decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            if "content-length" in headers and len(data) >= end + 4 + int(headers["content-length"]):
                stop = end + 4 + int(headers["content-length"])
                answers.append((int(lines[0].split()[1]), headers, data[end + 4 : stop]))
                data = data[stop:]
                continue
            if headers.get("transfer-encoding") == "chunked" and data.endswith(b"0\r\n\r\n"):
                answers.append((int(lines[0].split()[1]), headers, data[end + 4 :]))
                data = b""
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {len(answers)} answers"
        data += chunk
    return answers


def _metrics(proxy: ServiceProcess) -> str:
    return httpx.get(proxy.url + "/metrics", timeout=10).text


GENERATE: dict[str, object] = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}


def test_a_connection_is_served_then_handed_to_aiohttp_for_good(proxy: ServiceProcess) -> None:
    before = _metrics(proxy)
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(_call(GENERATE))
        [(status, headers, body)] = _answers(sock, 1)
        assert status == 200 and "x-request-id" in headers and orjson.loads(body)["meta_info"]
        assert "server" not in headers and headers["date"]  # the proxy's own protocol wrote it (aiohttp names itself)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        [(status, headers, _)] = _answers(sock, 1)
        assert status == 200 and "aiohttp" in headers["server"]
        sock.sendall(_call(GENERATE))  # the same connection stays aiohttp's
        [(status, headers, body)] = _answers(sock, 1)
        assert status == 200 and "aiohttp" in headers["server"] and orjson.loads(body)["meta_info"]
    after = _metrics(proxy)
    assert metric(after, "rollout_proxy_lean_calls_total") >= metric(before, "rollout_proxy_lean_calls_total") + 1
    handed = "rollout_proxy_http_connections_handed_total"
    assert metric(after, handed) == metric(before, handed) + 2  # this one and /metrics's own


def test_pipelined_calls_are_answered_in_order(proxy: ServiceProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(_call(GENERATE) + _call({**GENERATE, "input_ids": [7]}) + _call(GENERATE))
        answers = _answers(sock, 3)
    assert [a[0] for a in answers] == [200, 200, 200]
    assert len({a[1]["x-request-id"] for a in answers}) == 3
    assert all("server" not in a[1] for a in answers)


def test_what_the_lean_protocol_leaves_is_answered_by_aiohttp(proxy: ServiceProcess) -> None:
    raw = orjson.dumps(GENERATE)
    chunked = b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        len(raw), raw)  # fmt: skip
    escaped = orjson.dumps(GENERATE).replace(b'"input_ids"', b'"\\u0073tream":true,"input_ids"')  # "stream", spelt so
    cases = [
        (chunked, 200),
        (_call({**GENERATE, "stream": True}), 200),
        (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(escaped), escaped), 200),
        (_call({"input_ids": list(range(2000))}), 413),  # over --max-body-bytes
        (_call(GENERATE, extra=b"Content-Length: 3\r\n"), 400),  # two lengths: refused, never guessed
    ]
    for request, expected in cases:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.sendall(request)
            [(status, headers, body)] = _answers(sock, 1)
        assert status == expected, (request[:80], body[:200])
        assert "aiohttp" in headers["server"]
        if expected == 413:
            assert orjson.loads(body)["error"]["code"] == "payload_too_large"
    stream = _call({**GENERATE, "stream": True})
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(stream)
        [(_, headers, body)] = _answers(sock, 1)
    assert headers["content-type"].startswith("text/event-stream") and re.search(rb"data: \{", body)


def test_an_idle_connection_is_closed_quietly_after_the_keepalive(proxy: ServiceProcess) -> None:
    cut = 'rollout_proxy_http_connections_cut_total{phase="header"}'
    before = metric(_metrics(proxy), cut) if cut in _metrics(proxy) else 0.0
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(_call(GENERATE))
        _answers(sock, 1)
        sock.settimeout(15)
        assert sock.recv(1) == b""  # closed by the proxy (ROLLOUT_PROXY_HTTP_KEEPALIVE_S=1)
    text = _metrics(proxy)
    assert (metric(text, cut) if cut in text else 0.0) == before


class _Plane:
    """``DataPlane.serve`` answering at once."""

    def __init__(self) -> None:
        self.served: list[str] = []

    async def serve(self, request: Any) -> web.StreamResponse:
        self.served.append(request.path)
        return web.Response(body=b"{}", content_type="application/json")


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


async def test_no_call_is_served_while_the_client_leaves_its_answers_unread() -> None:
    plane, metrics = _Plane(), ProxyMetrics()
    guard = ClientGuard(ClientLimits(header_timeout_s=10, body_timeout_s=10, keepalive_s=10), metrics)
    server = LeanServer(cast(web.Server, None), cast(DataPlane, plane), guard, metrics, 1 << 20)
    connection, transport = server(), _Transport()
    connection.connection_made(transport)
    connection.data_received(_call(GENERATE))
    await asyncio.sleep(0.01)
    assert plane.served == ["/generate"] and len(transport.written) == 1
    connection.pause_writing()  # the transport's buffer of unread answers is past its high-water mark
    connection.data_received(_call(GENERATE) + _call(GENERATE))
    await asyncio.sleep(0.01)
    assert len(plane.served) == 1
    connection.resume_writing()
    await asyncio.sleep(0.01)
    assert len(plane.served) == 3 and len(transport.written) == 3
    connection.connection_lost(None)


def test_gateway_calls_are_served_by_the_lean_protocol(redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    own_db = redis_server.url.rsplit("/", 1)[0] + "/7"  # not the other proxy's membership (its engines' pool)
    with gateway_fleet(own_db, tmp_path, {"plain question": ["forty-two", "forty-three"]}) as fleet:
        sid, token = fleet.session()
        body: dict[str, object] = {"model": "policy", "messages": [{"role": "user", "content": "A plain question."}]}
        auth = b"Authorization: Bearer %s\r\n" % token.encode()
        path = b"/e/%s/v1/chat/completions" % sid.encode()
        with socket.create_connection(("127.0.0.1", fleet.proxy.port)) as sock:
            sock.sendall(_call(body, path, auth) + _call(body, path, b"Authorization: Bearer wrong\r\n"))
            (status, headers, raw), (refused, refused_headers, _) = _answers(sock, 2)
            sock.sendall(_call({**body, "stream": True}, path, auth))
            [(_, stream_headers, _)] = _answers(sock, 1)
        assert status == 200 and "server" not in headers, raw[:300]
        assert orjson.loads(raw)["choices"][0]["message"]["content"] == "forty-two"
        assert refused == 401 and "server" not in refused_headers
        assert "aiohttp" in stream_headers["server"]  # a stream is aiohttp's to write
        assert len(fleet.calls(sid)) == 2  # both answered calls are in the session's log
