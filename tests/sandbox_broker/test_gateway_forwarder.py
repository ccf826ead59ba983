"""The per-lease gateway forwarder's path rule: its own session's routes, nothing else."""

from __future__ import annotations

import pytest

from services.sandbox_broker.backends.gateway_forwarder import allowed

SID = "0123456789abcdef01234567"


@pytest.mark.parametrize(
    "target",
    [f"/e/{SID}/v1/chat/completions", f"/e/{SID}/v1/messages?beta=true", f"/e/{SID}/v1/models/gpt-4.1",
     f"/e/{SID}/v1beta/models/policy:streamGenerateContent?alt=sse", f"/e/{SID}/v1/responses"],
)  # fmt: skip
def test_the_own_session_passes(target: str) -> None:
    assert allowed(target, SID)


@pytest.mark.parametrize(
    "target",
    [
        "/admin/pools", "/generate", "/metrics", "/v1/chat/completions", f"/e/{SID}", f"/e/{SID}/",
        f"/e/{SID}x/v1/models", f"/e/{SID}/../other/v1/models", f"/e/{SID}/v1/../../../admin/pools",
        f"/e/{SID}/v1/%2e%2e/%2e%2e/admin", f"/e/{SID}/v1//models", f"/e/{SID}/./v1/models",
        f"/e/{SID}/v1beta/models/:x", f"/e/{SID}:/v1/models",
        "/e/fedcba9876543210fedcba98/v1/chat/completions", f"http://127.0.0.1/e/{SID}/v1/models",
    ],
)  # fmt: skip
def test_everything_else_is_refused(target: str) -> None:
    assert not allowed(target, SID)
