"""The proxy on a 3-master Redis Cluster: the weight-update transaction (its lock script, the shared
pool state) and fleet membership over pub/sub between the proxy's two processes, as in
``test_weights.py``, whose tests are collected here again with ``redis_url`` naming the cluster."""

from __future__ import annotations

import pytest

from tests.llm_proxy.test_weights import (  # noqa: F401  (collected again: they run on the cluster)
    test_second_concurrent_update_of_a_pool_is_refused,
    test_weight_update_with_a_failing_engine_fails_no_call,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def redis_url(redis_cluster_url: str) -> str:
    """The cluster's ``redis+cluster://`` URL in place of the single server's."""
    return redis_cluster_url
