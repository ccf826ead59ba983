"""Host firewall rules that keep docker egress sandboxes away from the host and private networks.

With inter-container traffic off, or even on an ``--internal`` network, a container still reaches
the host through its bridge's gateway address and the host's other addresses, and it reaches every
private network the host can route to. When the broker runs as root in the docker host's network
namespace (``docker_firewall``), it owns one iptables chain per sandbox bridge and hooks it in:

- INPUT from the bridge: rejected (a sandbox never talks to the host itself);
- FORWARD from the bridge: DNS to the host's resolvers allowed, then private, shared, link-local
  (metadata), multicast and reserved ranges and every network of the host rejected; the rest (the
  outside world, through docker's NAT) allowed.

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
    _iptables(["-I", "INPUT", "-i", bridge, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"])
    _iptables(["-I", "INPUT", "-i", bridge, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"])
    _iptables(["-I", "FORWARD", "-i", bridge, "-j", chain])
    log.info("sandbox bridge %s: host and private networks blocked (iptables chain %s)", bridge, chain)


def remove(bridge: str) -> None:
    """Remove the jumps and the chain; idempotent."""
    chain = chain_of(bridge)
    jumps = [
        ["INPUT", "-i", bridge, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
        ["INPUT", "-i", bridge, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"],
        ["FORWARD", "-i", bridge, "-j", chain],
    ]
    for jump in jumps:
        while _iptables(["-D", *jump], check=False):
            pass
    _iptables(["-F", chain], check=False)
    _iptables(["-X", chain], check=False)


def installed(bridge: str) -> bool:
    done = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, check=False)
    return f"-i {bridge} -j {chain_of(bridge)}" in done.stdout


def _iptables(args: list[str], check: bool = True) -> bool:
    done = subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise OSError(f"iptables {' '.join(args)} failed: {done.stderr.strip()}")
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
