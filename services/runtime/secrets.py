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
        """The shared token settings every service reads; the Redis password travels inside ``ROLLOUT_REDIS_URL``."""
        return {"ROLLOUT_ADMIN_TOKEN": self.admin_token, "ROLLOUT_SERVICE_TOKEN": self.service_token,
                "ROLLOUT_PROXY_REQUIRE_TOKEN": "true"}  # fmt: skip

    def env_file(self) -> str:
        lines = [f"{name}={value}" for name, value in sorted(self.env().items())]
        lines.append(f"ROLLOUT_REDIS_PASSWORD={self.redis_password}")
        return "\n".join(lines) + "\n"
