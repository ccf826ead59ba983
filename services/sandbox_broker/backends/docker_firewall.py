"""Host firewall rules that keep docker egress sandboxes away from the host and private networks.

With inter-container traffic off, or even on an ``--internal`` network, a container still reaches
the host through its bridge's gateway address and the host's other addresses, and it reaches every
private network the host can route to. When the broker runs as root in the docker host's network
namespace (``docker_firewall``), it owns one iptables chain per sandbox bridge and hooks it in:

- INPUT from the bridge: rejected (a sandbox never talks to the host itself);
- FORWARD from the bridge: DNS to the host's resolvers allowed, then private, shared, link-local
  (metadata), multicast and reserved ranges and every network of the host rejected; the rest (the
  outside world, through docker's NAT) allowed;
- IPv6 (ip6tables) from the bridge, INPUT and FORWARD: rejected. The sandbox network is created
  without IPv6, but a container's link-local address still reaches the host's services bound to
  ``::`` through the bridge.

The rules are re-asserted at start and removed at close. Elsewhere (compose, Kubernetes) the
operator sets the equivalent rules or NetworkPolicy: see docs/sandbox_broker.md.
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
import sys
from pathlib import Path

from services.sandbox_broker.backends.netns import DENY4, host_networks

log = logging.getLogger(__name__)


def chain_of(bridge: str) -> str:
    return f"ROLLOUT-{bridge}"[:28]


def resolvers(path: Path = Path("/etc/resolv.conf")) -> list[str]:
    found = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            address = ipaddress.ip_address(parts[1])
            if address.version == 4 and not address.is_loopback:
                found.append(str(address))
    return found


def chain_rules(chain: str) -> list[list[str]]:
    rules = [
        ["-A", chain, "-d", r, "-p", p, "--dport", "53", "-j", "RETURN"] for r in resolvers() for p in ("udp", "tcp")
    ]
    networks = [*DENY4, *(str(n) for n in host_networks() if n.version == 4)]
    for network in networks:
        rules.append(["-A", chain, "-d", network, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"])
        rules.append(["-A", chain, "-d", network, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"])
    return rules


def install(bridge: str) -> None:
    """(Re)install the chain for ``bridge`` and its jumps from INPUT and FORWARD."""
    remove(bridge)
    chain = chain_of(bridge)
    _iptables(["-N", chain])
    for rule in chain_rules(chain):
        _iptables(rule)
    for jump in reversed(_jumps(bridge)):  # inserted at the top, in this order
        _iptables(["-I", *jump])
    try:
        for jump in reversed(_jumps6(bridge)):
            _iptables(["-I", *jump], binary="ip6tables")
    except OSError as exc:  # a host without IPv6 filtering has no IPv6 for the sandboxes to use either
        log.warning("sandbox bridge %s: no ip6tables rules (%s)", bridge, exc)
    log.info("sandbox bridge %s: host and private networks blocked (iptables chain %s, IPv6 refused)", bridge, chain)


def _jumps(bridge: str) -> list[list[str]]:
    return [
        ["INPUT", "-i", bridge, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
        ["INPUT", "-i", bridge, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"],
        ["FORWARD", "-i", bridge, "-j", chain_of(bridge)],
    ]


def _jumps6(bridge: str) -> list[list[str]]:
    """IPv6 from a sandbox bridge: refused, to the host (a link-local address reaches its services
    on ``::``) and beyond (the sandbox network is created without IPv6: nothing to allow)."""
    return [
        [hook, "-i", bridge, *match]
        for hook in ("INPUT", "FORWARD")
        for match in (
            ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
            ["-j", "REJECT", "--reject-with", "icmp6-adm-prohibited"],
        )  # fmt: skip
    ]


def remove(bridge: str) -> None:
    """Remove the jumps and the chain; idempotent."""
    chain = chain_of(bridge)
    for binary, jumps in (("iptables", _jumps(bridge)), ("ip6tables", _jumps6(bridge))):
        for jump in jumps:
            while _iptables(["-D", *jump], check=False, binary=binary):
                pass
    _iptables(["-F", chain], check=False)
    _iptables(["-X", chain], check=False)


def installed(bridge: str) -> bool:
    done = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, check=False)
    return f"-i {bridge} -j {chain_of(bridge)}" in done.stdout


def installed6(bridge: str) -> bool:
    done = subprocess.run(["ip6tables", "-S"], capture_output=True, text=True, check=False)
    return all(f"-A {hook} -i {bridge} -j REJECT" in done.stdout for hook in ("INPUT", "FORWARD"))


def _iptables(args: list[str], check: bool = True, binary: str = "iptables") -> bool:
    done = subprocess.run([binary, "-w", "5", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise OSError(f"{binary} {' '.join(args)} failed: {done.stderr.strip()}")
    return done.returncode == 0


def main(argv: list[str]) -> int:
    """``python -m services.sandbox_broker.backends.docker_firewall install|remove BRIDGE`` (as root)."""
    if len(argv) != 2 or argv[0] not in ("install", "remove"):
        print("usage: python -m services.sandbox_broker.backends.docker_firewall install|remove BRIDGE")
        return 2
    (install if argv[0] == "install" else remove)(argv[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
