"""Settings every process shares, resolved one way by every service and the trainer.

A shared setting (``redis_url``, ``admin_token``, ``log_level``) is taken, highest first, from:

1. an explicit value: a command-line flag, or a keyword argument in code;
2. the process's own variable, ``ROLLOUT_<SERVICE>_<NAME>`` (e.g. ``ROLLOUT_API_REDIS_URL``);
3. the shared variable, ``ROLLOUT_<NAME>`` (e.g. ``ROLLOUT_REDIS_URL``);
4. the default. Without a Redis URL a service starts an embedded server; a worker or trainer,
   which must share the fleet's Redis, refuses to start (:meth:`UsesRedis.require_redis_url`).

An empty variable counts as unset. Each process's class picks the shared fields it uses by
inheriting :class:`UsesRedis` and/or :class:`UsesAdminToken`; every one has ``log_level``.

Every secret setting (a token, a key, a password, the Redis URL, which carries the password) can
also be read from a file, as Docker and Kubernetes mount secrets: ``<VARIABLE>_FILE`` names it
(``ROLLOUT_ADMIN_TOKEN_FILE``, ``ROLLOUT_API_REDIS_URL_FILE``); its content, less the trailing
newline, counts as the variable, just below the variable itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

SHARED_PREFIX = "ROLLOUT_"
SHARED_FIELDS = ("redis_url", "admin_token", "service_token", "log_level")

LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(lambda v: str(v).upper())
]


def shared_variable(field: str) -> str:
    """The shared environment variable of a shared field: ``redis_url`` -> ``ROLLOUT_REDIS_URL``."""
    return SHARED_PREFIX + field.upper()


class SharedEnvSource(PydanticBaseSettingsSource):
    """The shared ``ROLLOUT_<NAME>`` variables, for the shared fields a settings class declares."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value = _environ().get(shared_variable(field_name)) if field_name in SHARED_FIELDS else None
        return value, field_name, False

    def __call__(self) -> dict[str, Any]:
        found = {}
        for name, info in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(info, name)
            if value:
                found[name] = value
        return found


def _environ() -> dict[str, str]:
    return {k.upper(): v for k, v in os.environ.items()}


SECRET_SUFFIXES = ("password", "_api_key", "redis_url")  # beside the fields hidden from repr


def is_secret(name: str, info: FieldInfo) -> bool:
    """A setting that holds a credential: hidden from ``repr``, or named like one."""
    return info.repr is False or name.endswith(SECRET_SUFFIXES)


def read_secret_file(variable: str, path: str) -> str:
    try:
        return Path(path).read_text().rstrip("\r\n")
    except OSError as exc:
        raise ValueError(f"{variable}: cannot read {path}: {exc.strerror}") from None


class SecretFileSource(PydanticBaseSettingsSource):
    """``<VARIABLE>_FILE`` of each secret field: the class's own variables, or the shared ones."""

    def __init__(self, settings_cls: type[BaseSettings], *, shared: bool) -> None:
        super().__init__(settings_cls)
        self.shared = shared

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def variable(self, name: str) -> str | None:
        if self.shared:
            return shared_variable(name) + "_FILE" if name in SHARED_FIELDS else None
        return (str(self.settings_cls.model_config.get("env_prefix", "")) + name).upper() + "_FILE"

    def __call__(self) -> dict[str, Any]:
        env = _environ()
        found = {}
        for name, info in self.settings_cls.model_fields.items():
            variable = self.variable(name) if is_secret(name, info) else None
            if variable and env.get(variable):
                found[name] = read_secret_file(variable, env[variable])
        return found


class ServiceSettings(BaseSettings):
    """Base of every process's settings class: its own prefix first, then the shared variables."""

    model_config = SettingsConfigDict(extra="ignore", env_ignore_empty=True)
    service_name: ClassVar[str] = ""  # for messages: "api", "worker", ...

    log_level: LogLevel = "INFO"  # DEBUG, INFO, WARNING, ERROR or CRITICAL

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        shared = SharedEnvSource(settings_cls)
        own_file, shared_file = (
            SecretFileSource(settings_cls, shared=False),
            SecretFileSource(settings_cls, shared=True),
        )
        return init_settings, env_settings, own_file, shared, shared_file, dotenv_settings, file_secret_settings

    @classmethod
    def variable(cls, field: str) -> str:
        """This class's own environment variable for ``field``."""
        return str(cls.model_config.get("env_prefix", "")) + field.upper()

    @classmethod
    def variables(cls, field: str) -> str:
        """Where ``field`` may be set, for error messages: ``ROLLOUT_API_REDIS_URL or ROLLOUT_REDIS_URL``."""
        own = cls.variable(field)
        return f"{own} or {shared_variable(field)}" if field in SHARED_FIELDS else own


class UsesRedis(ServiceSettings):
    redis_url: str | None = None  # None: an embedded server where the process may start one

    def require_redis_url(self) -> str:
        """The Redis URL of a process that must share the fleet's Redis (worker, trainer)."""
        if not self.redis_url:
            raise SystemExit(f"{self.service_name or 'this process'} needs the fleet's Redis: "
                             f"--redis-url, {self.variables('redis_url')}")  # fmt: skip
        return self.redis_url


class UsesAdminToken(ServiceSettings):
    # the operator's bearer token; empty: admin routes refused. Servers accept a comma-separated list of
    # tokens or ``sha256:<hex>`` of them (rotation without downtime, docs/security.md)
    admin_token: str = Field("", repr=False)


class UsesServiceToken(ServiceSettings):
    # the platform's own services (workers, the API) towards the broker and the proxy. Servers accept a
    # comma-separated list (rotation); clients send the first entry (docs/security.md)
    service_token: str = Field("", repr=False)

    def client_token(self) -> str:
        return self.service_token.split(",")[0].strip()


class TunesGc(ServiceSettings):
    # cyclic GC of the serving process, set once it has started (services/runtime/gc_tuning.py): net new
    # container objects before a young collection (Python's default is 700); 0 turns automatic collection off
    gc_young_threshold: int = Field(100_000, ge=0)


class ServesHttp(ServiceSettings):
    """An HTTP server's limits on slow clients (``services/runtime/slow_clients.py``)."""

    http_header_timeout_s: float = Field(10.0, gt=0)  # a request's headers must all arrive within this
    http_body_timeout_s: float = Field(60.0, gt=0)  # and its whole body within this after the headers
    http_keepalive_s: float = Field(5.0, gt=0)  # a kept-alive connection idle this long is closed


class RedisSettings(BaseSettings):
    """``ROLLOUT_REDIS_*`` (bar ``ROLLOUT_REDIS_URL``, a shared setting): the embedded server, every client pool."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_REDIS_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        own_file = SecretFileSource(settings_cls, shared=False)  # ROLLOUT_REDIS_PASSWORD_FILE
        return init_settings, env_settings, own_file, dotenv_settings, file_secret_settings

    port: int = 0  # for the embedded server; 0 picks a free one
    appendonly: bool = False  # AOF persistence for the embedded server
    data_dir: Path | None = None  # where the embedded server keeps its AOF
    password: str | None = Field(None, repr=False)  # the embedded server's requirepass; None: a random one
    # every client pool (services.runtime.redis_pool): bounded, waits for a free connection, in /metrics
    pool_size: int = Field(1024, ge=1)  # connections per pool (Redis's own maxclients is 10,000)
    pool_wait_s: float = Field(30.0, gt=0)  # longest wait for a free connection before an error
    socket_timeout_s: float = Field(60.0, gt=30.0)  # longer than any blocking read (XREAD BLOCK <= 30 s)
    connect_timeout_s: float = Field(5.0, gt=0)
