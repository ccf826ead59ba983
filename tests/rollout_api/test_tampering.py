"""Known attacks on the grader, each through the real API, worker and broker (local sandboxes): none
may score. A pytest task (``add`` is wrong; FAIL_TO_PASS ``test_add``, PASS_TO_PASS ``test_sub``)
graded in a fresh sandbox, on the SWE route (its default) and on the plain route
(``reward.grade_in: "fresh"``), every attack on both; the gold patch scores 1.0 and every attack 0.0
(the fork bomb and the disk filler may end as an infra error instead: never 1). The plain route's
sandboxes have a small ``disk_mb``, so that the disk filler does fill its disk there.

Not covered (no grader that runs the policy's code in the test process can be): source code that, at
import, patches pytest's own reports or finds and rewrites the grader's report file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.benchmarks.attacks import EXHAUSTION, attack_scripts, write
from services.protocol import Status
from tests.rollout_api.fleet import ADMIN, SUBMIT, Fleet, bearer, create_job, running_fleet, trajectories, wait_finished
from tests.sandbox_broker.conftest import needs_bwrap
from tests.sandbox_broker.images_support import pytest_repo_image

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_bwrap]

GIT_INIT = "git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
ATTACKS = attack_scripts("tests/test_calc.py", "calc.py")
RULES: dict[str, list[Any]] = {
    "MODE<gold>": [f"```bash\n{write('calc.py', FIXED)}```", SUBMIT],
    "MODE<noop>": [SUBMIT],
    **{f"MODE<{name}>": [f"```bash\n{script}```", SUBMIT] for name, script in ATTACKS.items()},
}
F2P, P2P = ["tests/test_calc.py::test_add"], ["tests/test_calc.py::test_sub"]
TEST_COMMAND = "python3 -m pytest -rA tests/test_calc.py"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("tamper"), RULES, "tamper") as fleet:
        image = pytest_repo_image(fleet.state_dir / "img")
        template = {"name": "pycalc", "image": str(image), "host_usr": True}
        made = httpx.post(f"{fleet.broker.url}/templates", json=template, headers=bearer(ADMIN))
        assert made.status_code == 201, made.text
        fleet.start_worker(concurrency=20, ROLLOUT_WORKER_RETRY_BACKOFF_S="0.1")  # a route's 20 episodes at once
        yield fleet


def _swe_body(modes: list[str]) -> dict[str, Any]:
    instances = [{"instance_id": f"calc__{m}", "repo": "t/calc", "base_commit": "none",
                  "problem_statement": f"MODE<{m}>: add() subtracts", "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P}
                 for m in modes]  # fmt: skip
    return {"instances": instances, "template": "pycalc", "setup": [GIT_INIT], "test_command": TEST_COMMAND}


def _plain_body(modes: list[str]) -> dict[str, Any]:
    reward = {"command": TEST_COMMAND, "grade_in": "fresh",
              "tests": {"fail_to_pass": F2P, "pass_to_pass": P2P, "log_parser": "pytest"}}  # fmt: skip
    sandbox = {"template": "pycalc", "workdir": "/testbed", "setup": [GIT_INIT], "disk_mb": DISK_MB}
    return {"tasks": [{"id": f"calc__{m}", "prompt": f"MODE<{m}>", "sandbox": sandbox, "reward": reward}
                      for m in modes]}  # fmt: skip


DISK_MB = 96  # the plain route's sandboxes: the disk filler (at most 256 MB) meets ENOSPC


@pytest.mark.timeout(600)  # 20 episodes, each graded in a second sandbox; slow on a loaded machine
@pytest.mark.parametrize("route", ["/rollouts/swebench", "/rollouts"])
def test_no_attack_scores(fleet: Fleet, route: str) -> None:
    modes = ["gold", "noop", *ATTACKS]
    job = f"tamper{route.replace('/', '-')}"
    with fleet.client() as client:
        headers = create_job(client, job)
        body = _swe_body(modes) if route.endswith("swebench") else _plain_body(modes)
        response = client.post(route, json={"job": job, "group_size": 1, **body}, headers=headers)
        assert response.status_code == 202, response.text
        wait_finished(client, headers, response.json()["rollout_id"], timeout_s=560)
    found = {t.task_id.removeprefix("calc__"): t for t in trajectories(fleet.redis_url, job)}
    scores = {mode: (t.status, t.reward) for mode, t in found.items()}
    for mode in EXHAUSTION:  # an infra error is an allowed end for these (the reward is then null)
        if scores[mode][0] is Status.INFRA_ERROR:
            scores[mode] = (Status.COMPLETED, 0.0)
    expected = {mode: (Status.COMPLETED, 1.0 if mode == "gold" else 0.0) for mode in modes}
    details = {m: (t.infra, t.reward_details) for m, t in found.items() if scores[m] != expected[m]}
    assert scores == expected, (route, details)
    gold = found["gold"]
    assert gold.reward_details is not None and gold.reward_details.tests == {F2P[0]: "PASSED", P2P[0]: "PASSED"}
    assert gold.timings.grade_s > 0
