"""Agents in docker sandboxes: what the docker backend bind-mounts from the broker's host.

- ``/run/rollout`` (read-only): a per-container directory under ``<state_dir>/docker-gateway/``
  where the broker serves the lease's gateway socket (``gateway_forwarder.py``, the same forwarder
  as local sandboxes: only ``/e/{the lease's session}/...`` is relayed to the proxy, 403 otherwise).
  A command run with ``gateway_port`` starts behind the relay (``gateway_relay.py``) on
  ``127.0.0.1:PORT`` in the container's own network namespace, so the container stays
  ``network: "none"``. The relay runs on the container's ``python3`` (the image's own, or the
  host's with a ``host_usr`` template).
- ``/opt/agents`` (read-only): the broker's ``agents_dir`` (``rollout agents install``).
- ``/usr`` (read-only) for ``host_usr`` templates, plus the merged-/usr links (``/lib``, ``/lib64``,
  ``/bin``, ``/sbin``) where the image has none, made by root in the container right after it
  started: the host's Python (and the bundles' venvs built on it) then run on any image.

All of it needs an engine that sees this host's paths (``docker_host_paths``: the broker on the
engine's host, not in a container holding only its socket, not a remote engine); otherwise a
gateway binding, a ``gateway_port`` exec and a ``host_usr`` template answer 400.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
from pathlib import Path
from typing import Any

import docker.types

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import GATEWAY_SOCKET, Template
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.bwrap import AGENTS_DIR, GATEWAY_DIR, HOST_SYMLINKS
from services.sandbox_broker.backends.gateway_forwarder import relay_command
from services.sandbox_broker.settings import BrokerSettings

GATEWAY_ROOT = "docker-gateway"  # under the broker's state_dir
# run as root right after the container started (a host_usr template): the links local image sandboxes get
LINKS = "; ".join(f"[ -e {link} ] || [ -L {link} ] || ln -s {target} {link}" for target, link in HOST_SYMLINKS)
NO_PYTHON = ("command -v python3 >/dev/null 2>&1 || { echo 'the gateway relay needs python3 in the sandbox: '"
             "'an image with one, or a host_usr template' >&2; exit 127; }; exec \"$@\"")  # fmt: skip


class DockerAgents:
    """The mounts of one docker backend's containers and their gateway directories."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.enabled = settings.docker_host_paths
        self.root = settings.state_dir.resolve() / GATEWAY_ROOT
        self.agents_dir = str(settings.agents_dir.resolve()) if settings.agents_dir else None
        self.dirs: dict[str, Path] = {}  # container id -> its gateway directory (else read from its mounts)

    def refuse(self, what: str, field: str) -> PlatformError:
        why = (f"{what} needs an engine that sees the broker's paths (ROLLOUT_BROKER_DOCKER_HOST_PATHS is off: "
               "the engine is remote or the broker runs in a container with only its socket)")  # fmt: skip
        return PlatformError(ErrorCode.BAD_REQUEST, why, field=field)

    def new_dir(self) -> Path | None:
        """A fresh gateway directory for a container about to be created (None: no host paths)."""
        if not self.enabled:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)
        directory = self.root / secrets.token_hex(12)
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)  # the sandbox user connects to the socket in it, writes nothing
        return directory

    def mounts(self, template: Template, gateway: Path | None) -> list[Any]:
        if template.host_usr and not self.enabled:
            raise self.refuse(f"template {template.name!r} (host_usr)", "template")
        found: list[Any] = []
        if gateway is not None:
            found.append(docker.types.Mount(GATEWAY_DIR, str(gateway), type="bind", read_only=True))
        if self.enabled and self.agents_dir:
            found.append(docker.types.Mount(AGENTS_DIR, self.agents_dir, type="bind", read_only=True))
        if template.host_usr:
            found.append(docker.types.Mount("/usr", "/usr", type="bind", read_only=True))
        return found

    def remember(self, container_id: str, gateway: Path | None) -> None:
        if gateway is not None:
            self.dirs[container_id] = gateway

    def dir_of(self, container_id: str, attrs: dict[str, Any] | None) -> Path | None:
        """The container's gateway directory: kept from its creation, else its ``/run/rollout`` mount
        (a container created before this broker started), only ever under this broker's root."""
        found = self.dirs.get(container_id)
        if found is None and attrs is not None:
            for mount in attrs.get("Mounts") or []:
                source = Path(str(mount.get("Source", "")))
                if mount.get("Destination") == GATEWAY_DIR and source.parent == self.root:
                    found = source
        return found

    def forget(self, container_id: str, directory: Path | None) -> None:
        self.dirs.pop(container_id, None)
        if directory is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(directory)


def relayed(port: int, command: list[str]) -> list[str]:
    """``command`` behind the in-container relay on ``127.0.0.1:port`` (exit 127 and why without python3)."""
    return ["sh", "-c", NO_PYTHON, "sh", *relay_command("python3", port, GATEWAY_SOCKET, command)]


def link_usr(api: Any, container_id: str) -> None:
    """The merged-/usr links a ``host_usr`` container's image lacks, made by its root (blocking)."""
    # the image's own shell and ln: the host's (first on the usual PATH now) need the links first
    argv = ["/bin/sh", "-c", LINKS]
    exec_id = api.exec_create(container_id, argv, user="0:0", workdir="/", environment={"PATH": "/bin:/sbin"})["Id"]
    out = api.exec_start(exec_id).decode(errors="replace")
    code = api.exec_inspect(exec_id).get("ExitCode")
    if code != 0:
        raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, f"host_usr links exited {code}: {out[-300:]}")
