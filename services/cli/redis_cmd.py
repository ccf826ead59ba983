"""``rollout redis``: the embedded Redis server in the foreground."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from types import FrameType

from services.runtime.redis_server import EmbeddedRedis
from services.runtime.settings import RedisSettings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("redis", help="run the embedded Redis-compatible server in the foreground")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default: a free one)")
    p.add_argument("--appendonly", action="store_true", default=None, help="enable AOF persistence")
    p.add_argument("--data-dir", type=Path, default=None, help="directory for the AOF")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in vars(args).items() if k in ("port", "appendonly", "data_dir") and v is not None}
    settings = RedisSettings(**overrides)
    server = EmbeddedRedis(
        port=settings.port, appendonly=settings.appendonly, data_dir=settings.data_dir, host=args.host
    )
    if settings.password is not None:
        server.password = settings.password
    server.start()
    print(f"redis listening: {server.url}  (Ctrl-C to stop)", flush=True)

    def _stop(signum: int, frame: FrameType | None) -> None:
        server.terminate()

    signal.signal(signal.SIGTERM, _stop)
    try:
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
