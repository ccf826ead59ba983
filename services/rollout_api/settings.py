"""One settings class per process kind: ``ROLLOUT_API_*`` for the API, ``ROLLOUT_WORKER_*`` for workers."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServesHttp, TunesGc, UsesAdminToken, UsesRedis, UsesServiceToken


class ApiSettings(UsesRedis, UsesAdminToken, UsesServiceToken, ServesHttp, TunesGc):
    """``ROLLOUT_API_*``: the rollout API process."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_API_")
    service_name = "api"

    host: str = "127.0.0.1"
    port: int = 8000
    broker_url: str | None = None  # when set, templates are checked at submission (400 unknown_template)
    max_body_bytes: int = 32 * 1024 * 1024  # POST bodies above this get 413
    idempotency_ttl_s: int = 7 * 24 * 3600  # how long a submitted idempotency key is remembered
    template_cache_s: float = 5.0  # how long the broker's template list is reused
    # the API's own HTTP client (broker templates, dashboard sources): an explicit pool, in /metrics
    http_connections: int = Field(256, ge=1)  # most connections open at once; callers past it wait
    http_pool_wait_s: float = Field(5.0, gt=0)  # longest wait for a connection (then the check is skipped)
    sse_block_ms: int = Field(
        5_000, ge=1, le=30_000
    )  # XREAD BLOCK of a trajectory stream; a keep-alive follows each empty wait
    sse_connections: int = Field(4096, ge=1)  # Redis pool of the SSE readers (one connection per blocked reader)
    trajectory_stream_maxlen: int = 100_000  # MAXLEN ~ of trajectory streams (cancellations published here)
    # dashboard (/ui): the page reads the proxy's and the broker's admin/metrics routes server-side
    proxy_url: str | None = None  # the LLM proxy (pools, engines); None: the page shows no engines
    proxy_admin_token: str = Field("", repr=False)  # bearer token for the proxy's /admin routes; empty: admin_token
    broker_token: str = Field("", repr=False)  # bearer token for the broker's /metrics; empty: admin_token
    tokenizer_path: Path | None = None  # HF tokenizer dir: the viewer shows token texts (else token ids)
    dashboard_cache_s: float = 2.0  # how long one replica reuses the proxy's and broker's answers
    dashboard_sample_s: float = 5.0  # one replica samples every job and the fleet this often (history)
    dashboard_history_s: float = 3600.0  # how much history is kept
    # ``command`` agents with ``where: "host"`` run beside the platform on a worker's host (confined, but on
    # its network): only for trusted single-tenant setups (docs/security.md); 409 while 2+ jobs exist
    allow_host_agents: bool = False  # False: such a submission gets 403 ``forbidden`` (field agent.where)


class WorkerSettings(UsesRedis, UsesServiceToken, TunesGc):
    """``ROLLOUT_WORKER_*``: one rollout worker process."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_WORKER_")
    service_name = "worker"

    proxy_url: str = "http://127.0.0.1:8100"
    broker_url: str = "http://127.0.0.1:8200"
    model_path: Path | None = None  # HF tokenizer directory (tokenizer.json + tokenizer_config.json)
    # per proxy pool, the served model's directory (its tokenizer is used for that pool's jobs);
    # env: ROLLOUT_WORKER_POOL_MODEL_PATHS='{"pool": "/models/m"}'; pools not named use model_path
    pool_model_paths: dict[str, Path] = Field(default_factory=dict)
    worker_id: str = ""  # consumer name; default: hostname-pid
    concurrency: int = Field(64, ge=1)  # episodes at once in this process
    jobs: list[str] | None = None  # serve only these jobs (dedicated workers); None: every job
    host: str = "127.0.0.1"
    port: int = 0  # /healthz and /metrics; 0: a free port (logged)
    poll_interval_s: float = Field(0.05, gt=0)  # first idle wait when no job has work (or all are at quota)
    poll_max_s: float = Field(0.25, gt=0)  # the idle wait doubles up to this while rounds find nothing
    jobs_refresh_s: float = 2.0  # how often the job list (weights, quotas) is re-read
    heartbeat_s: float = 10.0  # XCLAIM own items (resets their idle time) and renew sandbox leases
    reclaim_idle_s: float = 60.0  # items idle this long belong to a dead worker and are reclaimed
    reclaim_interval_s: float = 5.0  # how often XAUTOCLAIM runs
    max_deliveries: int = Field(5, ge=1)  # an item delivered more often than this goes to the dead letters
    cancel_poll_s: float = 0.5  # how often running rollouts are checked for cancellation
    lease_ttl_s: float = 120.0  # sandbox lease TTL; renewed every heartbeat
    lease_wait_s: float = 60.0  # how long the broker may queue a lease request for capacity
    lease_batch_window_s: float = Field(0.002, ge=0, le=1.0)  # leases asked within this long: one broker request
    # warm sandboxes claimed straight from the broker's Redis first (the worker's Redis must be the
    # broker's: otherwise there is no offer to claim and every lease goes to the broker, as when off)
    warm_claims: bool = True
    retry_backoff_s: float = 1.0  # first infra-retry backoff; doubles per attempt
    retry_backoff_max_s: float = 30.0
    llm_timeout_s: float = 600.0  # per LLM call (also sent as X-Deadline-S)
    broker_timeout_s: float = 60.0  # HTTP overhead allowed on top of a command's own timeout
    trajectory_stream_maxlen: int = 100_000  # XADD MAXLEN ~ of each job's trajectory stream
    outage_budget_s: float = Field(600.0, ge=0)  # how long episodes are held while the proxy or broker is down
    probe_interval_s: float = Field(1.0, gt=0)  # health probe of a service that did not answer
    shutdown_grace_s: float = 30.0  # on SIGTERM, running episodes get this long before being handed back
    keep_messages: bool = True  # put readable messages in trajectories
    # ``command`` agents with ``where: "host"`` (trusted single-tenant setups only, docs/security.md):
    # False refuses them at run time (an infra_error naming this setting), never runs them silently
    allow_host_agents: bool = False
    # the dedicated unprivileged uid host agents run as (a worker running as root switches to it; its
    # files must be readable by it): in their own pid namespace, the host read-only (worker/host_agent.py)
    host_agent_uid: int = Field(64_999, ge=1)
    sandbox_gateway_port: int = Field(8399, ge=1024, le=65535)  # in-sandbox agents' loopback gateway port
