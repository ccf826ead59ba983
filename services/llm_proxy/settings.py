"""``ROLLOUT_PROXY_*``: the proxy's one settings object, built in ``main`` and passed down."""

from __future__ import annotations

import os

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.protocol.fields import DEFAULT_POOL
from services.runtime.settings import ServesHttp, TunesGc, UsesAdminToken, UsesRedis, UsesServiceToken


class ProxySettings(UsesRedis, UsesAdminToken, UsesServiceToken, ServesHttp, TunesGc):
    """Times are seconds, sizes tokens. ``engines``/``pools`` seed membership; the admin API changes it."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_PROXY_")
    service_name = "proxy"

    host: str = "127.0.0.1"
    port: int = 8100  # the workers' default proxy URL
    store_check_s: float = Field(5.0, gt=0)  # how often the parent checks that Redis kept its state
    http_keepalive_s: float = Field(75.0, gt=0)  # clients' idle connections (aiohttp's own default: 3630 s)
    workers: int = Field(default_factory=lambda: len(os.sched_getaffinity(0)), ge=1)
    engines: str = ""  # "url,url,...": engines of ``pool``
    pool: str = DEFAULT_POOL  # the pool ``engines`` join
    pools: str = ""  # "pool=url,url;pool2=url": more pools
    # authentication (docs/security.md): admin_token for /admin/*, service_token (the workers) and job tokens
    # for the data plane, each a comma-separated list of tokens or ``sha256:<hex>`` (rotation)
    require_token: bool = False  # data plane (/generate, /v1/*) needs a service, job or admin token
    allow_anonymous: bool = False  # UNSAFE, development only: a call without a token acts as admin
    # context guard
    context_cap: int = Field(65_536, gt=1)  # prompt + new tokens, per call
    max_new_tokens_cap: int = Field(8_192, ge=1)  # new tokens per call
    # upstream client
    connect_timeout_s: float = Field(10.0, gt=0)
    keepalive_s: float = Field(4.0, gt=0, lt=5.0)  # below SGLang's 5 s server keep-alive
    default_deadline_s: float | None = Field(None, gt=0)  # per call, unless X-Deadline-S says otherwise
    retries: int = Field(2, ge=0)  # other engines tried when a connection fails before sending
    # overload queue: while every engine of a pool holds engine_max_in_flight calls, calls wait (FIFO)
    engine_max_in_flight: int = Field(2048, ge=0)  # per engine, over all processes (split evenly); 0: no limit
    queue_max_calls: int = Field(20_000, ge=0)  # calls waiting at once, per process; past it 503 + Retry-After
    queue_max_bytes: int = Field(1024**3, ge=0)  # request bytes waiting at once, per process
    queue_wait_s: float = Field(600.0, gt=0)  # longest wait in the queue (503 capacity_exhausted after it)
    # server: explicit limits that the kernel or aiohttp would otherwise set silently
    listen_backlog: int = Field(16_384, ge=1)  # accept queue per process (the kernel caps it at somaxconn)
    max_body_bytes: int = Field(1024**3, ge=1)  # larger request bodies get 413
    # health and load
    health_interval_s: float = Field(1.0, gt=0)
    health_timeout_s: float = Field(2.0, gt=0)
    eject_after_failures: int = Field(3, ge=1)  # consecutive failed checks or calls
    sync_interval_s: float = Field(0.5, gt=0)  # local view refresh from Redis (pub/sub is faster)
    affinity_overload_factor: float = Field(2.0, ge=1)  # sticky engine skipped when load > f x min + slack
    affinity_overload_slack: int = Field(8, ge=0)
    # weight updates
    hold_queue_max: int = Field(100_000, ge=0)  # calls one process may hold during an update
    engine_call_timeout_s: float = Field(600.0, gt=0)  # one control-plane call to one engine
    lock_ttl_s: float = Field(900.0, gt=0)
    update_settle_s: float = Field(0.1, ge=0)  # wait after raising "updating" before pausing engines
    # agent gateway (per-pool "pool=value;pool2=value"; a pool not named uses the default)
    gateway_tokenizers: str = ""  # pool=HF tokenizer dir; default: the bundled tokenizer, else the pool's weights dir
    gateway_tool_parsers: str = ""  # pool=hermes|qwen25|qwen3_coder; default hermes
    gateway_routed_experts: str = ""  # pool=LAYERSxTOPK: request routed experts (routing replay) for the pool

    def gateway_map(self, field: str) -> dict[str, str]:
        """One of the per-pool gateway settings as {pool: value}."""
        found: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in str(getattr(self, field)).split(";"))):
            name, _, value = part.partition("=")
            if not name.strip() or not value.strip():
                raise ValueError(f"{field} entry {part!r} is not pool=value")
            found[name.strip()] = value.strip()
        return found

    def pool_map(self) -> dict[str, list[str]]:
        """Every seeded pool and its engine URLs."""
        found: dict[str, list[str]] = {}
        if self.engines.strip():
            found[self.pool] = _urls(self.engines)
        for part in filter(None, (p.strip() for p in self.pools.split(";"))):
            name, _, urls = part.partition("=")
            if not name.strip() or not urls.strip():
                raise ValueError(f"pools entry {part!r} is not pool=url,url")
            found.setdefault(name.strip(), []).extend(_urls(urls))
        return found


def _urls(text: str) -> list[str]:
    return [u.strip().rstrip("/") for u in text.split(",") if u.strip()]
