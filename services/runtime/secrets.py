"""The secrets of one deployment, and the environment that hands them to every service.

``rollout up`` generates a fresh set for its run; ``rollout secrets`` writes one as an env file
for compose (``env_file``) or for ``kubectl create secret generic --from-env-file`` (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.runtime.auth import new_secret


@dataclass(frozen=True)
class FleetSecrets:
    admin_token: str  # operators: job creation, templates, the proxy's admin API
    service_token: str  # the workers and the API towards the broker and the proxy
    redis_password: str  # Redis ``requirepass`` (also the embedded server)

    @classmethod
    def generate(cls) -> FleetSecrets:
        return cls(new_secret("rat_"), new_secret("rst_"), new_secret())

    def env(self) -> dict[str, str]:
        """Every service's token settings; the Redis password travels inside ``ROLLOUT_REDIS_URL``."""
        admin, service = self.admin_token, self.service_token
        return {
            "ROLLOUT_API_ADMIN_TOKEN": admin, "ROLLOUT_API_BROKER_TOKEN": service,
            "ROLLOUT_BROKER_ADMIN_TOKENS": admin, "ROLLOUT_BROKER_SERVICE_TOKENS": service,
            "ROLLOUT_PROXY_ADMIN_TOKENS": admin, "ROLLOUT_PROXY_SERVICE_TOKENS": service,
            "ROLLOUT_PROXY_REQUIRE_TOKEN": "true",
            "ROLLOUT_WORKER_BROKER_TOKEN": service, "ROLLOUT_WORKER_PROXY_TOKEN": service,
        }  # fmt: skip

    def env_file(self) -> str:
        lines = [f"{name}={value}" for name, value in sorted(self.env().items())]
        lines.append(f"ROLLOUT_REDIS_PASSWORD={self.redis_password}")
        return "\n".join(lines) + "\n"
