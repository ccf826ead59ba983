"""The deployment files are loaded into the services' settings classes and validated: every
``ROLLOUT_*`` variable they set must be a real setting, ports must agree, every service must find
Redis and its peers, and every rendered Kubernetes object must match the Kubernetes schemas."""

from __future__ import annotations

import copy
from functools import cache

import pytest
from pydantic_settings import BaseSettings

from services.deploy.check import (
    COMMANDS_WITHOUT_SETTINGS,
    K8S_VERSION,
    check,
    environment,
    load_settings,
    schema_errors,
    settings_classes,
    settings_errors,
    unknown_variables,
)
from services.deploy.manifests import Container, Obj, compose_containers, k8s_containers, load_compose, overlays, render
from services.engines.settings import EngineSettings
from services.llm_proxy.settings import ProxySettings
from services.rollout_api.settings import ApiSettings, WorkerSettings
from services.sandbox_broker.settings import BrokerSettings

CLASSES: dict[str, type[BaseSettings]] = settings_classes()


@cache
def rendered(overlay: str) -> list[Obj]:
    return render(next(p for p in overlays() if p.name == overlay))


def all_containers() -> list[Container]:
    found = list(compose_containers(load_compose()))
    for overlay in overlays():
        found += k8s_containers(f"k8s/{overlay.name}", rendered(overlay.name))
    return found


ALL = all_containers()


def test_there_is_a_dev_and_a_prod_overlay() -> None:
    assert {p.name for p in overlays()} >= {"dev", "prod"}


@pytest.mark.parametrize("container", ALL, ids=[c.name for c in ALL])
def test_settings_load_from_the_deployment(container: Container) -> None:
    assert settings_errors(container, CLASSES) == []
    if container.command in COMMANDS_WITHOUT_SETTINGS:
        return
    settings = load_settings(container, CLASSES)
    if container.command not in ("engine", "train", "redis"):  # every other service talks to Redis
        url = settings.redis_url
        assert url and url.startswith(("redis://", "rediss://")), f"{container.name} has no Redis URL"
    if container.command == "worker":
        assert settings.proxy_url.startswith("http://") and settings.broker_url.startswith("http://")


@pytest.mark.parametrize("source", ["compose", "k8s/dev", "k8s/prod"])
def test_every_service_is_deployed_and_has_engines(source: str) -> None:
    here = [c for c in ALL if c.source == source]
    assert {"proxy", "broker", "api", "worker", "engine"} <= {c.command for c in here}, source
    proxy = next(c for c in here if c.command == "proxy")
    listed = load_settings(proxy, CLASSES).pool_map().get("default")
    joining = [c for c in here if c.command == "engine" and "ROLLOUT_ENGINE_PROXY_URL" in c.env]
    assert listed or joining, f"{source}: the proxy has no engines and no engine joins its pool"


def test_prod_runs_sglang_on_gpus_and_the_trainer_under_torchrun() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered("prod")}
    engine = objects[("StatefulSet", "rollout-engine")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "ROLLOUT_ENGINE_MODE", "value": "sglang"} in engine["env"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    trainer = objects[("Job", "rollout-trainer")]["spec"]["template"]["spec"]["containers"][0]
    assert trainer["command"][0] == "torchrun"
    assert ("StatefulSet", "rollout-redis") not in objects  # external Redis in prod


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_every_object_matches_the_kubernetes_schemas(overlay: str) -> None:
    objects = rendered(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler", "StatefulSet"} <= kinds
    assert schema_errors(objects) == []


def test_schema_validation_catches_a_misspelt_field() -> None:
    deployment = copy.deepcopy(next(o for o in rendered("dev") if o["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    assert len(schema_errors([deployment], K8S_VERSION)) == 1


def test_a_misspelt_variable_would_be_caught() -> None:
    assert unknown_variables({"ROLLOUT_WORKER_CONCURENCY": "9"}, CLASSES) == [
        "ROLLOUT_WORKER_CONCURENCY is not a WorkerSettings setting"
    ]
    assert len(unknown_variables({"ROLLOUT_WROKER_PORT": "1"}, CLASSES)) == 1
    assert unknown_variables({"ROLLOUT_TRAIN_PARALLEL__TENSOR_PARALLEL": "2", "HOME": "/"}, CLASSES) == []


def test_deploy_check_reports_no_error() -> None:
    report = check()
    assert report.errors == 0, report.messages
    assert report.compose_ok and set(report.overlays_ok) == {"k8s/dev", "k8s/prod"}
    assert report.objects_validated >= 50


def test_defaults_fit_together() -> None:
    """Started with no settings on one host, the worker finds the proxy and the broker."""
    from urllib.parse import urlparse

    with environment({}):
        worker = WorkerSettings()
        assert urlparse(worker.proxy_url).port == ProxySettings().port
        assert urlparse(worker.broker_url).port == BrokerSettings().port
        assert len({ApiSettings().port, ProxySettings().port, BrokerSettings().port, EngineSettings().port}) == 4


@pytest.mark.parametrize("container", ALL, ids=[c.name for c in ALL])
def test_every_service_gets_its_secrets(container: Container) -> None:
    """Tokens and the Redis password reach every service from the env file or the Secret (issue 9)."""
    if container.command not in ("proxy", "broker", "api", "worker"):
        return
    settings = load_settings(container, CLASSES)
    assert settings.service_token, f"{container.name} has no service token"
    if container.command != "worker":
        assert settings.admin_token, f"{container.name} has no admin token"
    else:  # a worker runs tenants' episodes: the operators' token stays out of its environment
        assert "ROLLOUT_ADMIN_TOKEN" not in container.env, f"{container.name} is given the admin token"
    if container.command == "proxy":
        assert settings.require_token, "the proxy's data plane must require a token"
    assert "@" in str(settings.redis_url), f"{container.name}'s Redis URL carries no password"
