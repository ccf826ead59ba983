"""The deployment files are loaded into the services' settings classes: every ``ROLLOUT_*``
variable they set must be a real setting, ports must agree, and every service must find Redis
and its peers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from services.engines.settings import EngineSettings
from services.llm_proxy.settings import ProxySettings
from services.rollout_api.settings import ApiSettings, WorkerSettings
from services.runtime.settings import SHARED_FIELDS, shared_variable
from services.sandbox_broker.settings import BrokerSettings

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "rollout-platform:latest"
SETTINGS: dict[str, type[BaseSettings]] = {
    "engine": EngineSettings,
    "proxy": ProxySettings,
    "broker": BrokerSettings,
    "api": ApiSettings,
    "worker": WorkerSettings,
}
SHARED = {shared_variable(f) for f in SHARED_FIELDS}  # ROLLOUT_REDIS_URL, ...: read by every settings class


def compose_containers() -> Iterator[tuple[str, str, dict[str, str], list[int]]]:
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for name, svc in doc["services"].items():
        if svc.get("image") != IMAGE:
            continue
        env = {k: _expand(str(v)) for k, v in (svc.get("environment") or {}).items()}
        ports = [int(p.split(":")[-1]) for p in svc.get("ports", [])]
        yield name, svc["command"][0], env, ports


def _expand(value: str) -> str:
    """``${VAR:?message}`` as compose would expand it when VAR is set (to a test value)."""
    return re.sub(r"\$\{([A-Z_]+)(:[?-][^}]*)?\}", lambda m: f"test-{m.group(1).lower()}", value)


def k8s_containers() -> Iterator[tuple[str, str, dict[str, str], list[int]]]:
    docs = [d for f in sorted((ROOT / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    maps = {(d["kind"], d["metadata"]["name"]): d.get("data") or d.get("stringData") or {} for d in docs}
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            if c["image"] != IMAGE:
                continue
            env: dict[str, str] = {}
            for ref in c.get("envFrom", []):
                kind, key = ("ConfigMap", "configMapRef") if "configMapRef" in ref else ("Secret", "secretRef")
                env.update(maps[(kind, ref[key]["name"])])
            env.update({e["name"]: str(e["value"]) for e in c.get("env", [])})
            probe = c.get("readinessProbe", {}).get("httpGet", {}).get("port")
            ports = [p["containerPort"] for p in c.get("ports", [])] + ([probe] if probe else [])
            yield d["metadata"]["name"], c["args"][0], env, ports


ALL = [("compose", *c) for c in compose_containers()] + [("k8s", *c) for c in k8s_containers()]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for key in list(os.environ):
        if key.startswith("ROLLOUT_"):
            monkeypatch.delenv(key)
    return monkeypatch


def load(cls: type[BaseSettings], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return cls()


@pytest.mark.parametrize(("source", "name", "command", "env", "ports"), ALL, ids=[f"{a[0]}-{a[1]}" for a in ALL])
def test_settings_load_from_the_deployment(
    source: str, name: str, command: str, env: dict[str, str], ports: list[int], clean_env: pytest.MonkeyPatch
) -> None:
    cls = SETTINGS[command]
    prefix = str(cls.model_config.get("env_prefix", ""))
    for key in env:
        if key in SHARED:
            continue
        assert key.startswith(prefix), f"{source}/{name}: {key} is not a {cls.__name__} variable ({prefix}*)"
        assert key[len(prefix) :].lower() in cls.model_fields, f"{source}/{name}: {key} is not a setting"
    settings = load(cls, env, clean_env)
    assert all(p == settings.port for p in ports), f"{source}/{name}: ports {ports} vs setting {settings.port}"
    if command != "engine":  # every other service talks to Redis
        url = settings.redis_url
        assert url and url.startswith("redis://"), f"{source}/{name} has no Redis URL"
    if command == "proxy":
        assert settings.pool_map()["default"], "the proxy has no engines"
    if command == "worker":
        assert settings.proxy_url.startswith("http://") and settings.broker_url.startswith("http://")


def test_every_service_is_deployed() -> None:
    for source in ("compose", "k8s"):
        commands = {a[2] for a in ALL if a[0] == source}
        assert {"proxy", "broker", "api", "worker"} <= commands, source


def test_a_misspelt_variable_would_be_caught(clean_env: pytest.MonkeyPatch) -> None:
    assert "concurency" not in WorkerSettings.model_fields  # what the check above relies on
    assert load(WorkerSettings, {"ROLLOUT_WORKER_CONCURENCY": "9"}, clean_env).concurrency != 9


def test_defaults_fit_together(clean_env: pytest.MonkeyPatch) -> None:
    """Started with no settings on one host, the worker finds the proxy and the broker."""
    from urllib.parse import urlparse

    worker = WorkerSettings()
    assert urlparse(worker.proxy_url).port == ProxySettings().port
    assert urlparse(worker.broker_url).port == BrokerSettings().port
    assert len({ApiSettings().port, ProxySettings().port, BrokerSettings().port}) == 3
