"""``rollout deploy check``: render Compose and every Kubernetes overlay, validate each object
against the Kubernetes schemas (offline, ``kubernetes-validate``), and load every platform
container's environment into the settings class of the service it runs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from services.deploy.manifests import (
    Container,
    DeployError,
    Obj,
    compose_config_errors,
    compose_containers,
    k8s_containers,
    load_compose,
    overlays,
    render,
)
from services.runtime.settings import SHARED_FIELDS, shared_variable

SHARED = {shared_variable(f) for f in SHARED_FIELDS}  # ROLLOUT_REDIS_URL, ...: read by every process
COMMANDS_WITHOUT_SETTINGS = ("tokenizer",)  # a one-shot helper, configured by flags
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests must work on (HPA v2, PDB v1)


def settings_classes() -> dict[str, type[BaseSettings]]:
    """The settings class of each command a container can run (imported here: the trainer's pulls torch)."""
    from services.engines.settings import EngineSettings
    from services.llm_proxy.settings import ProxySettings
    from services.rollout_api.settings import ApiSettings, WorkerSettings
    from services.runtime.settings import RedisSettings
    from services.sandbox_broker.settings import BrokerSettings
    from trainer_client.settings import TrainSettings

    return {
        "engine": EngineSettings,
        "proxy": ProxySettings,
        "broker": BrokerSettings,
        "api": ApiSettings,
        "worker": WorkerSettings,
        "train": TrainSettings,
        "redis": RedisSettings,  # the embedded server (`rollout redis`) and every client pool
    }


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` holding exactly ``env`` among the ``ROLLOUT_*`` variables, restored afterwards."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("ROLLOUT_")}
    for key in saved:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith("ROLLOUT_")})
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("ROLLOUT_")]:
            del os.environ[key]
        os.environ.update(saved)


def load_settings(container: Container, classes: dict[str, type[BaseSettings]]) -> Any:
    """The container's settings object, built from its environment alone."""
    with environment(container.env):
        return classes[container.command]()


def unknown_variables(env: dict[str, str], classes: dict[str, type[BaseSettings]]) -> list[str]:
    """``ROLLOUT_*`` variables that name no setting of the service their prefix names (a shared
    Secret may carry several services' variables; each must still be real)."""
    prefixes = {str(cls.model_config.get("env_prefix", "")): cls for cls in classes.values()}
    found = []
    for key in env:
        if not key.startswith("ROLLOUT_") or key in SHARED:
            continue
        prefix = next((p for p in prefixes if key.startswith(p)), None)
        if prefix is None:
            found.append(f"{key} names no service (known prefixes: {', '.join(sorted(prefixes))})")
        elif key[len(prefix) :].lower().split("__")[0] not in prefixes[prefix].model_fields:
            found.append(f"{key} is not a {prefixes[prefix].__name__} setting")
    return found


def settings_errors(container: Container, classes: dict[str, type[BaseSettings]]) -> list[str]:
    """Variables that name no setting, values a setting refuses, ports that disagree."""
    if container.command in COMMANDS_WITHOUT_SETTINGS:
        return [f"{container.name}: {e}" for e in unknown_variables(container.env, classes)]
    cls = classes.get(container.command)
    if cls is None:
        return [f"{container.name}: runs unknown command {container.command!r}"]
    errors = [f"{container.name}: {e}" for e in unknown_variables(container.env, classes)]
    try:
        settings = load_settings(container, classes)
    except ValidationError as exc:
        return [*errors, f"{container.name}: {cls.__name__} refuses its environment: {exc}"]
    port = getattr(settings, "port", None)
    wrong = [p for p in container.ports if port is not None and p != port]
    if wrong:
        errors.append(f"{container.name}: ports {wrong} but the {container.command} listens on {port}")
    return errors


def schema_errors(objects: list[Obj], version: str = K8S_VERSION) -> list[str]:
    import kubernetes_validate

    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
            errors.append(f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}: {exc}")
    return errors


@dataclass
class Report:
    compose_ok: bool = False
    overlays_ok: list[str] = field(default_factory=list)
    overlays_failed: list[str] = field(default_factory=list)
    objects_validated: int = 0
    containers_checked: int = 0
    messages: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return len(self.messages)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "errors": self.errors}


def check(k8s_version: str = K8S_VERSION) -> Report:
    """Everything ``rollout deploy check`` verifies, as one report."""
    report = Report()
    classes = settings_classes()
    try:
        containers = list(compose_containers(load_compose()))
        found = compose_config_errors() + [e for c in containers for e in settings_errors(c, classes)]
        report.containers_checked += len(containers)
        report.messages += found
        report.compose_ok = not found
    except DeployError as exc:
        report.messages.append(str(exc))
    for overlay in overlays():
        name = f"k8s/{overlay.name}"
        try:
            objects = render(overlay)
        except DeployError as exc:
            report.messages.append(str(exc))
            report.overlays_failed.append(name)
            continue
        containers = list(k8s_containers(name, objects))
        found = schema_errors(objects, k8s_version) + [e for c in containers for e in settings_errors(c, classes)]
        report.objects_validated += len(objects)
        report.containers_checked += len(containers)
        report.messages += found
        (report.overlays_failed if found else report.overlays_ok).append(name)
    return report
