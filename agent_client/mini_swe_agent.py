"""Run the unmodified mini-swe-agent (PyPI ``mini-swe-agent``) as a ``command`` agent.

``python -m agent_client.mini_swe_agent CONFIG.yaml`` (argv of a :class:`CommandAgent`) loads a
mini-swe-agent YAML config, points its litellm model at the episode's gateway session
(``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, model ``openai/<OPENAI_MODEL>``, cost tracking off:
an unknown model would otherwise end the episode after the first call), runs its
``DefaultAgent`` on ``ROLLOUT_TASK`` with :class:`BrokerEnvironment` (every command runs in the
task sandbox through the broker), and exits 0 when the agent submitted.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

import yaml

from agent_client.sandbox import SandboxClient

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class BrokerEnvironment:
    """mini-swe-agent's ``Environment`` protocol over the episode's sandbox (``environment_class:
    agent_client.mini_swe_agent.BrokerEnvironment``); keeps mini-swe-agent's submit rule."""

    def __init__(self, *, timeout: int = 60, **config: Any) -> None:
        self.config = {"timeout": timeout, **config}
        self.box = SandboxClient.from_env()

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        result = self.box.exec(action.get("command", ""), timeout_s=timeout or self.config["timeout"], cwd=cwd or None)
        output = result.stdout + result.stderr
        lines = output.lstrip().splitlines(keepends=True)
        if result.exit_code == 0 and lines and lines[0].strip() == SUBMIT_MARKER:
            raise Submitted({"role": "exit", "content": "".join(lines[1:]),
                             "extra": {"exit_status": "Submitted", "submission": "".join(lines[1:])}})  # fmt: skip
        return {"output": output, "returncode": result.exit_code, "exception_info": ""}

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**platform.uname()._asdict(), **self.config, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": self.config, "environment_type": "BrokerEnvironment"}}}


def main(argv: list[str]) -> int:
    os.environ.setdefault("MSWEA_CONFIGURED", "1")
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models import get_model

    config = yaml.safe_load(Path(argv[0]).read_text()) if argv else {}
    model_config = {**config.get("model", {}), "model_name": f"openai/{os.environ.get('OPENAI_MODEL', 'policy')}",
                    "cost_tracking": "ignore_errors"}  # fmt: skip
    model_config["model_kwargs"] = {**model_config.get("model_kwargs", {}), "api_base": os.environ["OPENAI_BASE_URL"],
                                    "api_key": os.environ["OPENAI_API_KEY"]}  # fmt: skip
    agent = DefaultAgent(get_model(config=model_config), BrokerEnvironment(**config.get("environment", {})),
                         **{**config.get("agent", {}), "cost_limit": 0})  # fmt: skip
    info = agent.run(os.environ["ROLLOUT_TASK"])
    print(f"exit_status={info.get('exit_status')}")
    return 0 if info.get("exit_status") == "Submitted" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
