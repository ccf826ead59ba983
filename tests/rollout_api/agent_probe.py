"""An attacker's agent program (standard library only): what it can read and reach from where it
runs. Run as a ``command`` agent; prints one JSON line ``PROBE {...}``.

Environment: ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` (its own session), ``PROBE_PORTS`` (name=port,...
on 127.0.0.1: Redis, the broker, the proxy, the API), ``PROBE_HOSTS`` (host:port,... elsewhere),
``PROBE_LEASE`` and ``PROBE_SESSION`` (another job's lease and gateway session, as an attacker who
learnt their ids would try them)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse


def environs() -> dict[str, str]:
    """Every other process's environment this program can read."""
    found: dict[str, str] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    found[pid] = f.read().decode(errors="replace")
            except OSError:
                pass
    return found


def connect(host: str, port: str | int) -> str:
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return "connected"
    except OSError as exc:
        return type(exc).__name__


def status(base: str, method: str, path: str, key: str | None = None, body: object = None) -> int | str:
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        return conn.getresponse().status
    except OSError as exc:
        return type(exc).__name__
    finally:
        conn.close()


def over_socket(path: str) -> int | str:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect("/run/rollout/gateway.sock")
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return int(s.recv(64).split()[1])
    except OSError as exc:
        return type(exc).__name__


def main() -> None:
    base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    own = urllib.parse.urlsplit(base).path.rsplit("/v1", 1)[0]  # /e/{own session}
    lease, other = os.environ.get("PROBE_LEASE", "x"), "/e/" + os.environ.get("PROBE_SESSION", "x")
    chat = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    gateway = {  # through the agent's own gateway base URL
        "own models": status(base, "GET", own + "/v1/models", key),
        "other session models": status(base, "GET", other + "/v1/models", key),
        "other session chat": status(base, "POST", other + "/v1/chat/completions", key, chat),
        "dot-dot to other": status(base, "GET", own + "/../" + other[3:] + "/v1/models", key),
        "encoded dot-dot": status(base, "GET", own + "/v1/%2e%2e/%2e%2e/%2e%2e/admin/pools", key),
        "proxy generate": status(base, "POST", "/generate", key, {"input_ids": [1], "sampling_params": {}}),
        "proxy admin": status(base, "GET", "/admin/pools", key),
        "proxy metrics": status(base, "GET", "/metrics", key),
        "broker exec in other lease": status(base, "POST", f"/leases/{lease}/exec", key, {"shell": "id"}),
        "broker list leases": status(base, "GET", "/leases", key),
    }
    sockets = {"socket admin": over_socket("/admin/pools"), "socket other": over_socket(other + "/v1/models")}
    ports = dict(item.split("=") for item in os.environ.get("PROBE_PORTS", "").split(",") if item)
    tcp = {name: connect("127.0.0.1", port) for name, port in ports.items()}
    for target in filter(None, os.environ.get("PROBE_HOSTS", "").split(",")):
        tcp[target] = connect(*target.rsplit(":", 1))
    files: dict[str, object] = {}
    for path in ("/etc/shadow", "/root", "/run/rollout"):
        try:
            if os.path.isdir(path):
                files[path] = sorted(os.listdir(path))
            else:
                with open(path, "rb") as f:
                    files[path] = len(f.read())
        except OSError as exc:
            files[path] = type(exc).__name__
    report = {
        "uid": os.getuid(),
        "environ": environs(),
        "gateway": gateway,
        "sockets": sockets,
        "tcp": tcp,
        "files": files,
    }
    print("PROBE " + json.dumps(report))


main()
