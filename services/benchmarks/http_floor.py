"""The floor under a burst figure: N requests sent at the same moment, over connections already
open, to a server that answers at once, with the broker's server stack (uvicorn, its HTTP
protocol, asyncio's loop) and the worker's client (``runtime.http_client``) on this machine.

No broker code runs, so whatever a burst of N leases measures above this is the broker's; below
it no broker can go on this machine with a request per lease.

``python -m services.benchmarks.http_floor --port P`` is the server (a plain ASGI app answering
201 with a lease-sized JSON body).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

from services.benchmarks.broker_procs import python_proc
from services.benchmarks.report import percentile
from services.runtime.http_client import HttpClient

BODY = orjson.dumps({"id": "lse-" + "0" * 24, "sandbox_id": "sbx-" + "0" * 24, "warm": True, "start_s": 0.0,
                     "workdir": "/workspace", "template": "bench", "backend": "local"})  # fmt: skip
HEADERS = [(b"content-length", str(len(BODY)).encode()), (b"content-type", b"application/json")]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 201 if scope["method"] == "POST" else 200,
                "headers": HEADERS})  # fmt: skip
    await send({"type": "http.response.body", "body": BODY})


async def measure(n: int, rounds: int, log: Path) -> dict[str, float]:
    """p50 / p99 ms of ``rounds`` bursts of ``n`` (the median round's), against the no-op server."""
    server = python_proc(["-m", "services.benchmarks.http_floor", "--port", "{port}"], {}, log)
    server.start(timeout_s=60)
    try:
        rounds_ms = await _bursts(server.url, n, rounds)
    finally:
        server.stop()
    p50s = [percentile(ms, 50) for ms in rounds_ms]
    middle = rounds_ms[p50s.index(statistics.median_low(p50s))]
    return {"burst_floor_p50_ms": percentile(middle, 50), "burst_floor_p99_ms": percentile(middle, 99)}


async def _bursts(url: str, n: int, rounds: int) -> list[list[float]]:
    http = HttpClient(url)
    body = orjson.dumps({"template": "bench", "wait_s": 300, "ttl_s": 600})
    headers = {"Content-Type": "application/json", "Authorization": "Bearer " + "x" * 43}

    async def one() -> float:
        started = time.monotonic()
        answer = await http.request("POST", "/leases", body, headers, 60)
        orjson.loads(answer.body)
        return (time.monotonic() - started) * 1000

    try:
        await asyncio.gather(*(one() for _ in range(n)))  # opens the n connections
        out = []
        for _ in range(rounds):
            await asyncio.sleep(0.5)
            out.append(list(await asyncio.gather(*(one() for _ in range(n)))))
        return out
    finally:
        await http.close()


def main() -> None:
    import uvicorn

    from services.runtime.http_writes import BatchedWritesHttp

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_config=None, access_log=False, loop="asyncio",
                http=BatchedWritesHttp, timeout_keep_alive=30)  # fmt: skip


if __name__ == "__main__":
    main()
