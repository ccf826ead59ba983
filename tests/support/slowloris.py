"""Slowloris on loopback: connections that send their request a byte at a time, bounded in time."""

from __future__ import annotations

import asyncio
import re

import httpx

SLOW = 100  # connections: half trickle their headers, half their body
GIVE_UP_S = 30.0  # a connection the server has not closed by then is a failure (the tests' limits are 1 s)


async def trickle(port: int, head: bytes, drip: bytes) -> bool:
    """Send ``head``, then ``drip`` a byte every 0.2 s; True once the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        for _ in range(int(GIVE_UP_S / 0.2)):
            await writer.drain()
            try:
                if await asyncio.wait_for(reader.read(1024), 0.2) == b"":
                    return True
            except TimeoutError:
                pass
            writer.write(drip)
        return False
    except ConnectionError:
        return True
    finally:
        writer.close()


async def siege(port: int, url: str, path: bytes = b"/rollouts") -> tuple[list[bool], list[int]]:
    """``SLOW`` slow connections and 5 silent ones, while a client calls ``/healthz``; whether each was
    closed by the server, and the status of every ``/healthz`` answer meanwhile."""
    header = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nX-Slow: "
    body = (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    )
    slow = [asyncio.create_task(trickle(port, header if i % 2 else body, b"a")) for i in range(SLOW)]
    silent = [asyncio.create_task(trickle(port, b"", b"")) for _ in range(5)]  # connect, then say nothing
    served: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while not all(t.done() for t in slow) and len(served) < 200:
            served.append((await client.get("/healthz")).status_code)
            await asyncio.sleep(0.05)
    return list(await asyncio.gather(*slow, *silent)), served


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))
