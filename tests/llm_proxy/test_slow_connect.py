"""A connect that is merely slow is tried again elsewhere, never reported as a deadline (504)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from services.protocol import llm as h
from tests.llm_proxy.fleet import generate, start_engines, start_proxy
from tests.llm_proxy.test_failures import _session_for

pytestmark = pytest.mark.e2e


def test_a_slow_connect_is_retried_not_a_deadline(tmp_path: Path, redis_url: str, tarpit: str) -> None:
    logs = tmp_path / "logs"
    engine, urls = start_engines(logs, 1)
    proxy = None
    try:
        proxy = start_proxy(logs, redis_url, [tarpit, *urls], "--connect-timeout-s", "0.2",
                            "--eject-after-failures", "1000")  # fmt: skip
        session = _session_for(tarpit[len("http://") :], [tarpit[len("http://") :], urls[0][len("http://") :]])
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
        answers = [generate(proxy.url, body, {h.HEADER_SESSION: session}) for _ in range(4)]
        assert [a.status_code for a in answers] == [200] * 4, answers[0].text
        assert {a.headers[h.HEADER_ENGINE] for a in answers} == {urls[0][len("http://") :]}
        retried = [line for line in httpx.get(proxy.url + "/metrics").text.splitlines()
                   if line.startswith("rollout_proxy_connect_retries_total")]  # fmt: skip
        assert retried and float(retried[0].split()[-1]) >= 1
    finally:
        if proxy is not None:
            proxy.stop()
        engine.stop()
