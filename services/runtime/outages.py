"""An unreachable Redis is logged once per outage, not once per poll with a traceback.

Every loop that polls Redis (workers, the broker's reaper, the proxy's membership refresh, the
SSE feed, the HTTP error handlers) keeps one :class:`Outage`: the first failure logs a WARNING
with the error, later ones are only counted, and the first success after it logs how long it
lasted and how many calls failed. A caller that never sees a success (an HTTP error handler)
counts ``quiet_s`` without failures as the end of the outage.
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import BusyLoadingError, ReadOnlyError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Redis away (unreachable, timing out, read-only during a failover, loading its data), or no pooled
# connection within the wait: nothing was done and trying again later is right.
STORE_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, BusyLoadingError)


class Outage:
    """The state of one dependency as one loop sees it."""

    def __init__(self, what: str, logger: logging.Logger, quiet_s: float = 30.0) -> None:
        self.what = what
        self.log = logger
        self.quiet_s = quiet_s
        self.since: float | None = None  # monotonic start of the current outage
        self.last = 0.0  # monotonic time of the last failure
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self.since is not None and now - self.last > self.quiet_s:
            self.ok(now=self.last)  # a long quiet spell ended the last outage
        self.failures += 1
        self.last = now
        if self.since is None:
            self.since = now
            self.log.warning("%s unavailable: %r (logged once until it is back)", self.what, exc)

    def ok(self, *, now: float | None = None) -> None:
        if self.since is not None:
            lasted = (now or time.monotonic()) - self.since
            self.log.warning("%s back after %.1fs (%d failed calls)", self.what, lasted, self.failures)
            self.since, self.failures = None, 0
