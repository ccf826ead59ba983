"""Escape attempts, as shell snippets that print ``ESCAPED <what>`` when an attack works.

Network targets are host services this test starts on loopback and on the host's own address
(stand-ins that answer with a marker, the broker itself, Redis), the sandbox's gateway (the host),
the metadata address and private ranges. Packets to the last two never leave a sandbox: the rules
inside its namespace reject them (network "egress"), or there is no route at all (network "none").
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

MARKER = "HOST-SERVICE-" + secrets.token_hex(4)
OUTSIDE = ("169.254.169.254", "10.0.0.1", "172.16.0.1", "192.168.0.1", "100.64.0.1", "10.0.2.2")


@dataclass(frozen=True)
class Targets:
    """What runs on the host for the sandboxes to attack."""

    host_ip: str  # the host's own non-loopback address
    loopback_port: int  # a service bound to 127.0.0.1 only
    any_port: int  # a service bound to 0.0.0.0 (every address of the host)
    broker_port: int
    redis_port: int

    def services(self, *extra_hosts: str) -> list[tuple[str, int]]:
        ports = (self.loopback_port, self.any_port, self.broker_port, self.redis_port)
        hosts = ("127.0.0.1", self.host_ip, "10.0.2.2", *extra_hosts)  # 10.0.2.2: slirp4netns's gateway (the host)
        return [(h, p) for h in hosts for p in ports] + [(h, 80) for h in OUTSIDE]


def host_ip() -> str:
    links = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    for link in links:
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and not ipaddress.ip_address(info["local"]).is_loopback:
                return str(info["local"])
    raise RuntimeError("no non-loopback IPv4 address on this host")


@contextlib.contextmanager
def marker_service(address: str) -> Iterator[int]:
    """A TCP service that greets every connection with the marker; yields its port."""
    server = socket.create_server((address, 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def greet(conn: socket.socket) -> None:
        # Closing a socket with unread input sends a reset, and a reset that overtakes the
        # greeting (slirp4netns relays it late under load) discards it: so send, half-close,
        # and read the prober's bytes until it hangs up before closing.
        with conn:
            conn.settimeout(5)
            conn.sendall(f"{MARKER}\n".encode())
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(4096):
                    pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=greet, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


GATEWAY = "$(ip route | awk '/default/ {print $3}')"  # a container's gateway: the host's bridge address


def connect_script(targets: Targets, connect: str, *extra_hosts: str) -> str:
    """``connect`` is a shell function body taking HOST PORT and printing what the service sends."""
    lines = [f"probe() {{ {connect}; }}"]
    for host, port in targets.services(*extra_hosts):
        lines.append(
            f'out=$(probe {host} {port} 2>&1); case "$out" in *{MARKER}*|*PONG*|*HTTP/1*|*CONNECTED*) '
            f'echo "ESCAPED connect {host}:{port}: $out";; esac'
        )
    return "\n".join(lines)


BASH_CONNECT = (
    "timeout 3 bash -c \"exec 3<>/dev/tcp/$1/$2 && echo CONNECTED && printf 'PING\\r\\nGET / HTTP/1.0\\r\\n\\r\\n' >&3 "
    '&& timeout 2 cat <&3"'
)
BUSYBOX_CONNECT = "printf 'PING\\r\\nGET / HTTP/1.0\\r\\n\\r\\n' | timeout 3 nc $1 $2"


def host_script(broker_pid: int, canary: str) -> str:
    """Host processes, files outside the workspace, /etc/shadow, mounts, network admin, capabilities."""
    return "\n".join(
        [
            f'grep -q services.cli /proc/{broker_pid}/cmdline 2>/dev/null && echo "ESCAPED sees the broker process"',
            'n=$(set -- /proc/[0-9]*; echo $#); [ "$n" -gt 20 ] && echo "ESCAPED sees $n processes"',
            f"echo pwned > {canary} 2>/dev/null",  # the test checks the host's file is unchanged
            'grep -q "^root:" /etc/shadow 2>/dev/null && echo "ESCAPED read /etc/shadow"',
            'mkdir -p /tmp/m; mount -t tmpfs none /tmp/m 2>/dev/null && echo "ESCAPED mounted a tmpfs"',
            'mount -o remount,rw / 2>/dev/null && echo "ESCAPED remounted /"',
            'ip link add escape0 type dummy 2>/dev/null && echo "ESCAPED added a link"',
            'ip addr add 10.9.9.9/32 dev lo 2>/dev/null && echo "ESCAPED added an address"',
            'ip route add 10.9.9.0/24 dev lo 2>/dev/null && echo "ESCAPED added a route"',
            'nft flush ruleset 2>/dev/null && echo "ESCAPED flushed nftables"',
            'iptables -F 2>/dev/null && echo "ESCAPED flushed iptables"',
            'unshare -r true 2>/dev/null && echo "ESCAPED made a user namespace"',
            'grep -E "^Cap(Eff|Prm|Amb):" /proc/self/status | grep -v "0000000000000000" | sed "s/^/ESCAPED /"',
            'echo pwned > /proc/sys/kernel/hostname 2>/dev/null && echo "ESCAPED wrote a sysctl"',
        ]
    )


READ_ONLY_HOST = "\n".join(  # local sandboxes see the host's /usr read-only, and no host /etc to write
    f'echo pwned > {path} 2>/dev/null && echo "ESCAPED wrote {path}"'
    for path in ("/usr/escape", "/etc/escape", "/escape")
)
# processes counted by a glob, not ``ls``: gVisor's kernel (Debian's runsc) refuses the statx flags of
# Debian 12's ls (``ls: cannot access '/proc': Invalid argument``), which would count 0 and prove nothing
FORK_BOMB = (  # sh: bash retries a failed fork for seconds; dash and busybox give up at once
    "sh -c 'i=0; while [ $i -lt 3000 ]; do sleep 20 2>/dev/null & i=$((i+1)); done 2>/dev/null; "
    "n=$(set -- /proc/[0-9]*; echo $#); echo running=$n'"
)
MEMORY = "dd if=/dev/zero of=/dev/null bs={mb}M count=1 2>&1 && echo ESCAPED allocated {mb} MB"
DISK = (
    'for f in a b c; do dd if=/dev/zero of={dir}/fill-$f bs=1M count={half} 2>&1 | grep -E "No space|copied"; done; '
    "used=$(du -sm {dir} | cut -f1); [ $used -gt {mb} ] && echo ESCAPED wrote $used MB; echo used=$used"
)
