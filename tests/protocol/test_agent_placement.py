"""Where a ``command`` agent runs (``where``), and the gateway binding of a paired agent's sandbox."""

from __future__ import annotations

import pydantic
import pytest

from services.protocol.agents import CommandAgent
from services.protocol.sandboxes import GatewayBinding


def test_where_is_sandbox_by_default_and_beside_is_host() -> None:
    assert CommandAgent(argv=["a"]).where == "sandbox"
    assert CommandAgent(argv=["a"], where="beside").where == "host"


def test_a_bundle_runs_in_a_sandbox_the_task_s_or_the_agent_s() -> None:
    assert CommandAgent(argv=["a"], where="paired", bundle="x", agent_template="agents").bundle == "x"
    with pytest.raises(pydantic.ValidationError, match="sandbox"):
        CommandAgent(argv=["a"], where="host", bundle="x")


def test_agent_template_is_for_paired_agents_only() -> None:
    with pytest.raises(pydantic.ValidationError, match="paired"):
        CommandAgent(argv=["a"], agent_template="agents")
    with pytest.raises(pydantic.ValidationError, match="agent_template"):
        CommandAgent(argv=["a"], where="paired", agent_template="../x")


def test_a_task_lease_comes_with_the_broker_that_holds_it() -> None:
    base = {"session": "0123456789ab", "upstream": "http://127.0.0.1:1"}
    assert GatewayBinding(**base, task_lease="lease-1", broker="http://127.0.0.1:2").task_lease == "lease-1"
    for extra in (
        {"task_lease": "lease-1"},
        {"broker": "http://127.0.0.1:2"},
        {"task_lease": "..", "broker": "http://b"},
    ):
        with pytest.raises(pydantic.ValidationError):
            GatewayBinding(**base, **extra)
