"""Egress for local sandboxes: a network namespace of their own, user-space NAT, and rules inside it.

Each egress sandbox gets a network namespace kept alive by a bind mount on ``<sandbox>/netns`` (no
holder process), an nftables ruleset loaded inside it by nft, started from a thread of the broker
that made the namespace its own (the rules in place before anything else runs there), and a
slirp4netns process that gives it a tap device behind user-space NAT. The commands join the
namespace with ``nsenter --net`` and then drop to the sandbox uid; the namespace belongs to the
host's user namespace, so the sandbox (no capabilities there) cannot change its rules.

Why slirp4netns rather than pasta: Debian 12's pasta (passt 2023-03) splices the namespace's
loopback to every host port by default, copies the host's own address into the namespace, cannot
open a bare PID's namespace as root and needs ``--runas 0`` plus a named netns; slirp4netns 1.2 has
``--disable-host-loopback``, ``--enable-sandbox``, ``--enable-seccomp``, a ready fd and a fixed
10.0.2.0/24 layout, and was ready in about 5 ms here. Neither protects host services on the host's
other addresses by itself: that is what the ruleset is for.

The ruleset rejects, from inside the namespace: loopback (the namespace's own ``lo`` stays usable),
the gateway 10.0.2.2 (the host) and every private, shared, link-local (169.254.0.0/16, metadata),
multicast and reserved range, every address of the host and every network the host sits on; DNS
goes only to slirp's forwarder 10.0.2.3:53. Destinations a template allow-lists are accepted first.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from services.protocol.sandboxes import split_destination
from services.sandbox_broker.backends import mounts

log = logging.getLogger(__name__)
T = TypeVar("T")

DNS = "10.0.2.3"  # slirp4netns's DNS forwarder
RESOLV_CONF = f"nameserver {DNS}\noptions timeout:2 attempts:2\n"
HOSTS = "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n"
READY_TIMEOUT_S = 10.0
KIND = "slirp4netns+nftables"
DENY4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
         "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/3")  # fmt: skip
DENY6 = ("::/127", "::ffff:0:0/96", "64:ff9b::/96", "100::/64", "fc00::/7", "fe80::/10", "ff00::/8")
TOOLS = ("slirp4netns", "nft", "nsenter", "ip")


def ns_file(root: Path) -> Path:
    return root / "netns"


def enter_prefix(root: Path) -> list[str]:
    """What a command runs under to join the sandbox's namespace (as root, before dropping the uid)."""
    return ["nsenter", f"--net={ns_file(root)}"]


def host_networks(max_age_s: float = 0.0) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every address of this host, and the network each one sits on (its neighbours); read again
    unless the last read is younger than ``max_age_s`` (a burst of egress creates reads it once)."""
    global _read_at, _networks
    if _networks is not None and time.monotonic() - _read_at < max_age_s:
        return _networks
    _networks, _read_at = _read_host_networks(), time.monotonic()
    return _networks


# when the host's networks were last read, and what they were
_read_at: float = 0.0
_networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] | None = None


def _read_host_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    done = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=False)
    found: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for link in json.loads(done.stdout or "[]"):
        for info in link.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                found.append(ipaddress.ip_network(info["local"]))
                found.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    return sorted(set(found), key=str)


def ruleset(allow: list[str], host: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str:
    """The nftables ruleset of one egress sandbox (see the module's docstring)."""
    deny4 = [*DENY4, *(str(n) for n in host if n.version == 4)]
    deny6 = [*DENY6, *(str(n) for n in host if n.version == 6)]
    lines = [
        "table inet sandbox {",
        f"  set deny4 {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {', '.join(deny4)} }} }}",
        f"  set deny6 {{ type ipv6_addr; flags interval; auto-merge; elements = {{ {', '.join(deny6)} }} }}",
        "  chain out {",
        "    type filter hook output priority 0; policy accept;",
        '    oifname "lo" accept',
        f"    ip daddr {DNS} meta l4proto {{ tcp, udp }} th dport 53 accept",
    ]
    for entry in allow:
        network, port = split_destination(entry)
        family = "ip" if network.version == 4 else "ip6"
        match = f" meta l4proto {{ tcp, udp }} th dport {port}" if port is not None else ""
        lines.append(f"    {family} daddr {network}{match} accept")
    lines += [  # a TCP reset fails a connect at once (an ICMP error only after the SYN's retransmit timeout)
        "    ip daddr @deny4 meta l4proto tcp reject with tcp reset",
        "    ip6 daddr @deny6 meta l4proto tcp reject with tcp reset",
        "    ip daddr @deny4 reject with icmpx type admin-prohibited",
        "    ip6 daddr @deny6 reject with icmpx type admin-prohibited",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def open_namespace(root: Path, rules: str) -> int:
    """Create the namespace, start slirp4netns on it and load ``rules``; return slirp4netns's pid."""
    path = ns_file(root)
    path.touch()
    _in_own_thread(lambda: _make_namespace(path, rules))
    read_fd, write_fd = os.pipe()
    try:
        pid = _in_own_thread(lambda: _spawn_slirp(path, write_fd))
        (root / "slirp.pid").write_text(str(pid))
        os.close(write_fd)
        write_fd = -1
        poller = select.poll()  # not select(): a broker holding two pipes per exec agent passes fd 1024
        poller.register(read_fd, select.POLLIN)
        ready = poller.poll(READY_TIMEOUT_S * 1000)
        if not ready or os.read(read_fd, 1) != b"1":
            raise OSError(f"slirp4netns was not ready within {READY_TIMEOUT_S:g} s")
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    return pid


def _in_own_thread(work: Callable[[], T]) -> T:
    """``work()`` in a thread of its own, which it may move to other namespaces (``unshare``): they end
    with the thread. No other thread of the broker (the thread pool's included) ever changes namespace."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # raised again in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="netns")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _make_namespace(path: Path, rules: str) -> None:
    """In a thread of its own: a new network namespace for it, kept alive by a bind mount on ``path``,
    and ``rules`` loaded there by nft, which starts in the thread's namespace (what ``unshare
    --net=PATH nft -f -`` did, one program start less)."""
    mounts.unshare(mounts.CLONE_NEWNET)
    mounts.bind(Path(f"/proc/self/task/{threading.get_native_id()}/ns/net"), path)
    _run(["nft", "-f", "-"], "nft", stdin=rules)


def _spawn_slirp(netns: Path, ready_fd: int) -> int:
    """In a thread of its own: slirp4netns in a session of its own (it outlives a killed broker, like
    the sandbox), its ready fd as fd 3. posix_spawn, not Popen: no object that warns while the process
    runs on.

    It starts in a mount namespace of its own whose mounts are all private (the thread's, made as
    ``unshare --mount --propagation private`` would, one program start less). ``--enable-sandbox``
    makes only ``/`` private in the namespace it creates, then detaches the old root: every mount below
    a shared mount of the host's was then unmounted on the host as well (propagation), e.g. the root
    filesystem of every running container of a dockerd, whose data root is a shared mount."""
    mounts.unshare_private_mounts()
    binary = shutil.which("slirp4netns") or "slirp4netns"
    argv = [binary, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox", "--enable-seccomp",
            "--ready-fd", "3", "--netns-type=path", str(netns), "tap0"]  # fmt: skip
    fd = ready_fd if ready_fd != 3 else os.dup(ready_fd)  # dup2(3, 3) would keep close-on-exec
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
               (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
               (os.POSIX_SPAWN_DUP2, fd, 3)]  # fmt: skip
    try:
        return os.posix_spawn(binary, argv, {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}, file_actions=actions,
                              setsid=True)  # fmt: skip
    finally:
        if fd != ready_fd:
            os.close(fd)


def close_namespace(root: Path) -> None:
    """Stop slirp4netns and drop the namespace; idempotent, also after a broker restart."""
    pid_file = root / "slirp.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        if str(ns_file(root)).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():  # not a reused pid
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
    pid_file.unlink(missing_ok=True)
    path = ns_file(root)
    mounts.detach(path)  # nothing there (no egress): one failed system call, no read of the mount table
    path.unlink(missing_ok=True)


def probe(scratch: Path) -> str:
    """'' when egress sandboxes can be isolated here, else why not."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install slirp4netns nftables util-linux iproute2)"
    if os.geteuid() != 0:
        return "the broker is not root (network namespaces and their rules need it)"
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        open_namespace(scratch, ruleset([], host_networks()))
        return ""
    except OSError as exc:
        return str(exc)
    finally:
        close_namespace(scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def _reap(pid: int) -> None:
    """Collect our own killed child (a previous broker's is init's to collect)."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.005)


def _run(argv: list[str], what: str, stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{what} failed: {done.stderr.strip()[-300:]}")
