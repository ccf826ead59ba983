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
    password: str | None = Field(None, repr=False)  # the embedded server's requirepass; None: a random one
