"""``rollout redis``: the embedded Redis server in the foreground.

It prints its URL with the password masked and writes the whole URL to a file only its user can
read (``--url-file``, default ``~/.rollout/redis.url``), for ``ROLLOUT_REDIS_URL_FILE``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

from services.runtime.redis_server import EmbeddedRedis
from services.runtime.settings import RedisSettings

DEFAULT_URL_FILE = Path("~/.rollout/redis.url")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("redis", help="run the embedded Redis-compatible server in the foreground")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default: a free one)")
    p.add_argument("--appendonly", action="store_true", default=None, help="enable AOF persistence")
    p.add_argument("--data-dir", type=Path, default=None, help="directory for the AOF")
    p.add_argument("--url-file", type=Path, default=None,
                   help=f"write the URL, password included, here (mode 0600; default {DEFAULT_URL_FILE})")  # fmt: skip
    p.set_defaults(handler=run)


def masked(url: str) -> str:
    """``url`` with its password (and user) replaced by ``***``: safe to print or log."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f":***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its user alone (its directory created 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def run(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in vars(args).items() if k in ("port", "appendonly", "data_dir") and v is not None}
    settings = RedisSettings(**overrides)
    server = EmbeddedRedis(
        port=settings.port, appendonly=settings.appendonly, data_dir=settings.data_dir, host=args.host
    )
    if settings.password is not None:
        server.password = settings.password
    url_file = (args.url_file or DEFAULT_URL_FILE).expanduser()
    server.start()

    def _stop(signum: int, frame: FrameType | None) -> None:
        server.terminate()

    # before the "listening" line: a SIGTERM sent on reading it (a test, a supervisor) ends the server
    # through ``finally``, which removes its temporary data directory; the default action skipped that
    signal.signal(signal.SIGTERM, _stop)
    try:
        write_private(url_file, server.url + "\n")
        where = f"full URL in {url_file} (ROLLOUT_REDIS_URL_FILE={url_file})"
    except OSError as exc:
        if args.url_file is not None:  # asked for: its failure is the command's
            server.stop()
            print(f"cannot write {url_file}: {exc}", file=sys.stderr)
            return 1
        where = f"the full URL could not be written to {url_file}: {exc.strerror}"
    print(f"redis listening: {masked(server.url)}  ({where}; Ctrl-C to stop)", flush=True)
    try:
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
