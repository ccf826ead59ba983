"""The proxy on a 3-master Redis Cluster: the weight-update transaction's lock (a Lua script on the
``{fleet}`` slot) and the shared pool state its two processes read and are told of over pub/sub,
as in ``test_weights.py``, whose test is collected here again with ``redis_url`` naming the cluster.
(The rest of the proxy's Redis use runs in ``tests/rollout_api/test_cluster_e2e.py``.)"""

from __future__ import annotations

import pytest

from tests.llm_proxy.test_weights import (  # noqa: F401  (collected again: they run on the cluster)
    test_second_concurrent_update_of_a_pool_is_refused,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def redis_url(redis_cluster_url: str) -> str:
    """The cluster's ``redis+cluster://`` URL in place of the single server's."""
    return redis_cluster_url
