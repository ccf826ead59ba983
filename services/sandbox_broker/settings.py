"""``ROLLOUT_BROKER_*``: the one settings class of the broker process."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServesHttp, TunesGc, UsesAdminToken, UsesRedis, UsesServiceToken

BackendName = Literal["local", "docker", "e2b"]


class BrokerSettings(UsesRedis, UsesAdminToken, UsesServiceToken, ServesHttp, TunesGc):
    """Built once in ``main()`` and passed down."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_BROKER_")
    service_name = "broker"

    host: str = "127.0.0.1"
    port: int = 8200  # the workers' default broker URL
    http_keepalive_s: float = Field(30.0, gt=0)  # the workers' clients close theirs after 4 s idle
    backend: BackendName = "local"
    redis_connections: int = Field(1024, gt=0)  # pool size; requests wait for a free connection past it
    instance: str = ""  # replica name, stable across restarts; default "<hostname>:<port>"
    allow_unisolated: bool = False  # UNSAFE: run local sandboxes without namespaces if bwrap fails

    # authentication (docs/security.md): admin_token (operators: templates, every lease), service_token
    # (workers and the API: every job's leases, no templates), job tokens from Redis (their own leases);
    # each setting a comma-separated list of tokens or ``sha256:<hex>`` of them (rotation)
    allow_anonymous: bool = False  # UNSAFE, development only: a call without a token acts as admin
    template_roots: str = ""  # ":"-separated directories a template's ``rootfs`` may come from
    template_images: str = ""  # ","-separated image prefixes a template's ``image`` must start with; "" = any

    # local backend
    state_dir: Path = Path("/tmp/rollout-broker")  # sandboxes' workspaces (shared by replicas on a host)
    sandbox_uid: int = 1000  # the non-root uid commands run as
    pids_max: int = Field(512, gt=0)  # cgroup pids limit per sandbox
    nofile: int = Field(4096, gt=0)  # RLIMIT_NOFILE per command
    image_store_mb: int = Field(20_480, gt=0)  # unpacked images kept (LRU beyond it, never one in use)
    # agent bundles (``rollout agents install NAME --dir DIR``), bound read-only at /opt/agents in every
    # local sandbox without an image and every docker sandbox (docker_host_paths); None: none
    agents_dir: Path | None = None
    exec_agents: bool = True  # a resident exec agent per sandbox (backends/exec_agent.py); off: a bwrap per command
    # the agents of namespace sandboxes without an image forked from one zygote (backends/agent_zygote.py;
    # root brokers only); off, and for gVisor and image sandboxes: a fresh interpreter per sandbox
    agent_zygote: bool = True
    # every bubblewrap of a local sandbox starts in a small mount namespace of its own (backends/launch_ns.py;
    # root brokers only), not the broker's, which holds every live sandbox's mounts; off: the broker's
    launch_namespace: bool = True

    # docker backend
    docker_host: str | None = None  # e.g. unix:///run/docker.sock; None: DOCKER_HOST
    docker_network: str = "rollout-sandboxes"  # the one shared network
    docker_image: str = "rollout/sandbox:latest"  # image of the built-in default template
    docker_runtime: str | None = None  # e.g. "runsc"
    docker_exec_root: str | None = None  # the engine's exec root on this host: enables the leftover-monitor check
    docker_bridge: str | None = None  # bridge interface name of the shared network when the broker creates it
    # iptables rules on this host that keep egress sandboxes from the host and private networks (the broker
    # runs as root in the docker host's network namespace); otherwise the operator sets them (docs)
    docker_firewall: bool = False
    # disk_mb as a per-container size limit of the engine's storage driver (backends/docker_disk.py):
    # "auto" where the driver can (else /healthz and /metrics say it is not enforced), "require"
    # refuses to start without it, "off" never asks for it
    docker_disk_quota: Literal["auto", "require", "off"] = "auto"
    # the engine sees this host's paths (the broker runs on the engine's host): every container gets its
    # lease's gateway socket directory (under state_dir) at /run/rollout and agents_dir at /opt/agents, and
    # host_usr templates the host's /usr, all bind-mounted read-only (backends/docker_agents.py); off for a
    # remote engine or a broker in a container holding only the engine's socket (those then answer 400)
    docker_host_paths: bool = True

    # e2b backend
    e2b_template: str = "base"  # template of the built-in default template
    e2b_api_key: str | None = None  # None: E2B_API_KEY
    e2b_api_url: str | None = None  # None: E2B_API_URL or E2B's cloud
    e2b_sandbox_url: str | None = None  # None: E2B_SANDBOX_URL or the per-sandbox envd URL
    e2b_workdir: str = "/home/user"  # where commands start and relative file paths point
    e2b_sandbox_timeout_s: int = Field(300, gt=0)  # a sandbox dies this long after its last keepalive
    e2b_max_sandboxes: int = Field(100, gt=0)  # the plan's concurrency cap (pool included)
    e2b_retries: int = Field(5, ge=0)  # on 429 rate limits, with exponential backoff and jitter

    # leases and pools
    default_warm_pool: int = Field(0, ge=0)  # warm-pool target of the built-in default template
    # the warm pools' sandboxes on offer to workers, who claim them straight from Redis with no broker
    # request (protocol/warm_offers.py); off: only POST /leases hands them out
    warm_offers: bool = True
    create_timeout_s: float = Field(120.0, gt=0)  # a sandbox must be ready within this
    setup_timeout_s: float = Field(300.0, gt=0)  # template setup commands, together
    reap_interval_s: float = Field(2.0, gt=0)  # expired-lease sweep
    orphan_interval_s: float = Field(15.0, gt=0)  # sweep for sandboxes with no lease
    ttl_grace_s: float = Field(60.0, ge=0)  # a lease record outlives its expiry this long (for the reaper)
    # a group's or a template's set-up snapshot is dropped once unused this long
    shared_setup_ttl_s: float = Field(900.0, gt=0)

    # admission control
    max_leases: int = Field(4096, gt=0)  # all replicas together
    max_backend_leases: int = Field(4096, gt=0)  # leases on this replica's backend, all replicas together
    job_quota: int = Field(4096, gt=0)  # leases per job
    create_rate: float = Field(0.0, ge=0)  # sandbox creates per second per replica; 0 = unlimited
    create_burst: int = Field(10, gt=0)
    max_output_bytes: int = Field(8_000_000, gt=0)  # hard cap per stream, whatever the request says
    max_file_bytes: int = Field(256 * 1024 * 1024, gt=0)  # upload limit (files and archives)

    def instance_name(self) -> str:
        return self.instance or f"{socket.gethostname()}:{self.port}"
