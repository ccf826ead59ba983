"""Settings shared by every process that talks to Redis."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class RedisSettings(BaseSettings):
    """``ROLLOUT_REDIS_*``: where Redis is, or how to run the embedded one."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_REDIS_", extra="ignore")

    url: str | None = None  # None: start an embedded server on a free loopback port
    port: int = 0  # for the embedded server; 0 picks a free one
    appendonly: bool = False  # AOF persistence for the embedded server
    data_dir: Path | None = None  # where the embedded server keeps its AOF
    # every client pool (services.runtime.redis_pool): bounded, waits for a free connection, in /metrics
    pool_size: int = Field(1024, ge=1)  # connections per pool (Redis's own maxclients is 10,000)
    pool_wait_s: float = Field(30.0, gt=0)  # longest wait for a free connection before an error
    socket_timeout_s: float = Field(60.0, gt=30.0)  # longer than any blocking read (XREAD BLOCK <= 30 s)
    connect_timeout_s: float = Field(5.0, gt=0)
