"""The docker backend's agent mounts without an engine: what a broker whose engine does not see its
paths refuses, and which gateway directories it trusts; the refusal on backends without a forwarder."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import Template
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.base import no_gateway
from services.sandbox_broker.backends.docker_agents import GATEWAY_ROOT, LINKS, DockerAgents
from services.sandbox_broker.settings import BrokerSettings


def test_an_engine_that_does_not_see_the_brokers_paths_gets_no_mounts_and_host_usr_is_refused(tmp_path: Path) -> None:
    agents = DockerAgents(BrokerSettings(state_dir=tmp_path, agents_dir=tmp_path, docker_host_paths=False))
    assert agents.new_dir() is None and agents.mounts(Template(name="t"), None) == []
    with pytest.raises(PlatformError) as refused:
        agents.mounts(Template(name="t", host_usr=True), None)
    assert (refused.value.code, refused.value.field) == (ErrorCode.BAD_REQUEST, "template")
    assert "ROLLOUT_BROKER_DOCKER_HOST_PATHS" in agents.refuse("the gateway forwarder", "gateway").message


def test_every_container_gets_its_own_gateway_directory_and_only_ours_are_trusted(tmp_path: Path) -> None:
    agents = DockerAgents(BrokerSettings(state_dir=tmp_path, agents_dir=tmp_path))
    first, second = agents.new_dir(), agents.new_dir()
    assert first is not None and second is not None and first != second and first.parent == tmp_path / GATEWAY_ROOT
    assert oct(first.stat().st_mode & 0o777) == "0o755"
    targets = [m["Target"] for m in agents.mounts(Template(name="t", host_usr=True), first)]
    assert targets == ["/run/rollout", "/opt/agents", "/usr"]
    assert all(m["ReadOnly"] for m in agents.mounts(Template(name="t", host_usr=True), first))
    mounted = {"Mounts": [{"Destination": "/run/rollout", "Source": str(second)}]}
    assert agents.dir_of("c2", mounted) == second  # a container created before this broker started
    elsewhere = {"Mounts": [{"Destination": "/run/rollout", "Source": "/etc"}]}
    assert agents.dir_of("c3", elsewhere) is None  # never a directory outside the broker's own root
    agents.forget("c2", second)
    assert not second.exists() and first.exists()
    assert LINKS.count("ln -s") == 4


def test_a_backend_without_a_forwarder_refuses_with_its_reason() -> None:
    refused = no_gateway("e2b")
    assert (refused.code, refused.field) == (ErrorCode.BAD_REQUEST, "gateway")
    assert "e2b backend" in refused.message and "local and docker do" in refused.message
