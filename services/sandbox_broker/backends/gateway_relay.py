"""The gateway relay: the leader of a local sandbox command started with ``gateway_port``.

It listens on ``127.0.0.1:PORT`` in the command's own network namespace (the sandbox has no other
network), starts the command as its child, relays every connection to the lease's gateway socket
(``/run/rollout/gateway.sock``, served on the host by the broker's forwarder, which passes only the
lease's own gateway session) and exits with the command's status (128 + N for a signal N). An agent
then reaches its session at ``http://127.0.0.1:PORT/e/{session}/v1`` like any HTTP base URL.

This file is sent to the sandbox's python3 as source (``python3 -I -S -c SOURCE PORT SOCKET ARGV...``)
and uses only the standard library.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

CHUNK = 65_536


def pump(source: socket.socket, target: socket.socket) -> None:
    """Copy one direction until its end, then pass the end on (a half-close)."""
    try:
        while data := source.recv(CHUNK):
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def relay(conn: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        conn.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, conn), daemon=True)
    back.start()
    pump(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


def serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=relay, args=(conn, path), daemon=True).start()


def main(args: list[str]) -> None:
    port, path, argv = int(args[0]), args[1], args[2:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    pid = os.fork()
    if pid == 0:
        listener.close()
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"{argv[0]}: {exc.strerror}\n".encode())
            os._exit(127)
    threading.Thread(target=serve, args=(listener, path), daemon=True).start()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv[1:])
