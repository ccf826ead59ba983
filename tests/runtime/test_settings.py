"""Every process resolves the shared settings (Redis URL, admin and service tokens, log level) the same way:
the same variables, the same precedence (flag > ROLLOUT_<SERVICE>_<NAME> > ROLLOUT_<NAME> > default)."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from services.engines.settings import EngineSettings
from services.llm_proxy.settings import ProxySettings
from services.rollout_api.dump import DumpSettings
from services.rollout_api.settings import ApiSettings, WorkerSettings
from services.runtime.settings import (
    SHARED_FIELDS,
    RedisSettings,
    ServiceSettings,
    UsesRedis,
    is_secret,
    shared_variable,
)
from services.sandbox_broker.settings import BrokerSettings
from trainer_client.settings import TrainSettings

ROOT = Path(__file__).resolve().parents[2]
PROCESSES: list[type[ServiceSettings]] = [
    EngineSettings, ProxySettings, BrokerSettings, ApiSettings, WorkerSettings, TrainSettings, DumpSettings,
]  # fmt: skip
# which shared settings each process uses: every one logs; all but the engines talk to Redis
USES = {
    EngineSettings: {"log_level", "admin_token"},  # admin_token: engines join their proxy pool (/admin/engines)
    ProxySettings: {"log_level", "redis_url", "admin_token", "service_token"},
    BrokerSettings: {"log_level", "redis_url", "admin_token", "service_token"},
    ApiSettings: {"log_level", "redis_url", "admin_token", "service_token"},
    WorkerSettings: {"log_level", "redis_url", "service_token"},
    TrainSettings: {"log_level", "redis_url", "admin_token"},
    DumpSettings: {"log_level", "redis_url"},
}
VALUES = {"redis_url": ("redis://shared:1/0", "redis://own:2/0"), "admin_token": ("shared-t", "own-t"),
          "service_token": ("shared-s", "own-s"), "log_level": ("WARNING", "DEBUG")}  # fmt: skip
CASES = [(cls, field) for cls in PROCESSES for field in sorted(USES[cls])]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.upper().startswith("ROLLOUT_"):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.mark.parametrize("cls", PROCESSES, ids=lambda c: c.__name__)
def test_each_process_declares_the_shared_settings_it_uses(cls: type[ServiceSettings]) -> None:
    assert {f for f in SHARED_FIELDS if f in cls.model_fields} == USES[cls]


@pytest.mark.parametrize(("cls", "field"), CASES, ids=[f"{c.__name__}-{f}" for c, f in CASES])
def test_precedence(cls: type[ServiceSettings], field: str, clean_env: pytest.MonkeyPatch) -> None:
    shared, own = VALUES[field]
    default = cls.model_fields[field].default
    assert getattr(cls(), field) == default
    clean_env.setenv(shared_variable(field), shared)
    assert getattr(cls(), field) == shared  # the shared variable alone
    clean_env.setenv(cls.variable(field), "")
    assert getattr(cls(), field) == shared  # an empty variable counts as unset
    clean_env.setenv(cls.variable(field), own)
    assert getattr(cls(), field) == own  # the process's own variable beats the shared one
    explicit = "ERROR" if field == "log_level" else "explicit"
    flag: dict[str, Any] = {field: explicit}
    assert getattr(cls(**flag), field) == explicit  # a flag beats both


@pytest.mark.parametrize("cls", PROCESSES, ids=lambda c: c.__name__)
def test_other_fields_never_come_from_the_shared_prefix(
    cls: type[ServiceSettings], clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("ROLLOUT_PORT", "1")
    clean_env.setenv("ROLLOUT_HOST", "10.9.9.9")
    built = cls()
    assert getattr(built, "port", None) != 1 and getattr(built, "host", None) != "10.9.9.9"


@pytest.mark.parametrize("cls", [WorkerSettings, TrainSettings], ids=lambda c: c.__name__)
def test_worker_and_trainer_refuse_to_start_without_the_fleets_redis(
    cls: type[UsesRedis], clean_env: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit, match=f"{cls.variable('redis_url')} or ROLLOUT_REDIS_URL"):
        cls().require_redis_url()
    clean_env.setenv("ROLLOUT_REDIS_URL", "redis://shared:1/0")
    assert cls().require_redis_url() == "redis://shared:1/0"


def test_log_level_is_checked() -> None:
    assert ApiSettings(log_level="debug").log_level == "DEBUG"
    with pytest.raises(ValueError, match="log_level"):
        ApiSettings(log_level="loud")


def test_every_settings_class_of_a_process_is_a_service_settings() -> None:
    """No process reads its own environment another way: every BaseSettings subclass in the tree
    (bar the embedded Redis server's options) derives from ServiceSettings."""
    found = set()
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "trainer_client").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "BaseSettings" for b in node.bases):
                found.add(node.name)
    assert found == {"ServiceSettings", "RedisSettings"}
    assert {c.__name__ for c in PROCESSES} == {c.__name__ for c in _leaf_subclasses(ServiceSettings)}


def _leaf_subclasses(cls: type) -> set[type]:
    subs: set[type] = set(cls.__subclasses__())
    leaves = {s for s in subs if not s.__subclasses__()}
    for s in subs - leaves:
        leaves |= _leaf_subclasses(s)
    return leaves


SETTINGS: list[type[BaseSettings]] = [*PROCESSES, RedisSettings]
SECRETS = [(cls, name) for cls in SETTINGS for name, info in cls.model_fields.items() if is_secret(name, info)]


def test_every_credential_is_a_secret_setting() -> None:
    names = {name for _, name in SECRETS}
    assert {"admin_token", "service_token", "redis_url", "password", "e2b_api_key", "api_token"} <= names
    assert "require_token" not in names and "prefill_s_per_token" not in names  # flags and figures are no secrets


@pytest.mark.parametrize(("cls", "field"), SECRETS, ids=[f"{c.__name__}-{f}" for c, f in SECRETS])
def test_every_secret_setting_reads_from_a_file(
    cls: type[BaseSettings], field: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``<VARIABLE>_FILE``, as Docker and Kubernetes mount secrets; just below the variable itself."""
    own = str(cls.model_config.get("env_prefix", "")).upper() + field.upper()
    (tmp_path / "own").write_text("from-own-file\n")
    clean_env.setenv(own + "_FILE", str(tmp_path / "own"))
    assert getattr(cls(), field) == "from-own-file"  # the trailing newline is no part of it
    clean_env.setenv(own, "from-variable")
    assert getattr(cls(), field) == "from-variable"
    clean_env.delenv(own)
    if field in SHARED_FIELDS:
        (tmp_path / "shared").write_text("from-shared-file")
        clean_env.setenv(shared_variable(field) + "_FILE", str(tmp_path / "shared"))
        assert getattr(cls(), field) == "from-own-file"  # the process's own file beats the shared one
        clean_env.setenv(shared_variable(field), "from-shared-variable")
        assert getattr(cls(), field) == "from-own-file"
        clean_env.delenv(own + "_FILE")
        assert getattr(cls(), field) == "from-shared-variable"
        clean_env.delenv(shared_variable(field))
        assert getattr(cls(), field) == "from-shared-file"


def test_an_unreadable_secret_file_names_its_variable(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("ROLLOUT_ADMIN_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="ROLLOUT_ADMIN_TOKEN_FILE"):
        ApiSettings()
