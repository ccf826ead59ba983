"""A synchronous client for the task sandbox of the current episode (the broker's exec/file API).

The worker starts a ``command`` agent with ``ROLLOUT_BROKER_URL``, ``ROLLOUT_BROKER_TOKEN``,
``ROLLOUT_LEASE_ID`` and ``ROLLOUT_WORKDIR`` set; :meth:`SandboxClient.from_env` reads them. The
token is the episode's own: exec and files on this one lease, until the agent ends; the broker
answers 404 for any other lease and 401 for every other route (listing, renewing, releasing)::

    from agent_client.sandbox import SandboxClient
    box = SandboxClient.from_env()
    result = box.exec("ls -la")          # ExecResult: exit_code, stdout, stderr, timed_out
    box.write_file("notes.txt", "hi")    # relative paths are under the workdir
    print(box.read_file("notes.txt"))
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import httpx

from services.protocol.sandboxes import ExecRequest, ExecResult


@dataclass
class SandboxClient:
    broker_url: str
    lease_id: str
    workdir: str = "/workspace"
    token: str = ""  # the lease token (``Authorization: Bearer``)
    env: dict[str, str] = field(default_factory=dict)  # added to every command's environment
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=None))

    def __post_init__(self) -> None:
        if self.token:
            self.http.headers["Authorization"] = f"Bearer {self.token}"

    @classmethod
    def from_env(cls) -> SandboxClient:
        env = os.environ
        return cls(env["ROLLOUT_BROKER_URL"].rstrip("/"), env["ROLLOUT_LEASE_ID"],
                   env.get("ROLLOUT_WORKDIR", "/workspace"), env.get("ROLLOUT_BROKER_TOKEN", ""))  # fmt: skip

    def exec(self, command: str, timeout_s: float = 60.0, cwd: str | None = None) -> ExecResult:
        request = ExecRequest(shell=command, timeout_s=timeout_s, env=self.env, cwd=cwd or self.workdir)
        response = self.http.post(
            f"{self.broker_url}/leases/{self.lease_id}/exec", json=request.model_dump(mode="json", exclude_none=True)
        )
        response.raise_for_status()
        return ExecResult.model_validate(response.json())

    def write_file(self, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        response = self.http.put(f"{self.broker_url}/leases/{self.lease_id}/files", params={"path": self._path(path)},
                                 content=data)  # fmt: skip
        response.raise_for_status()

    def read_file(self, path: str) -> bytes | None:
        response = self.http.get(f"{self.broker_url}/leases/{self.lease_id}/files", params={"path": self._path(path)})
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.content

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    def close(self) -> None:
        self.http.close()
