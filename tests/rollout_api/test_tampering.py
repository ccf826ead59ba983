"""Known attacks on the grader, each through the real API, worker and broker (local sandboxes): none
may score. A pytest task (``add`` is wrong; FAIL_TO_PASS ``test_add``, PASS_TO_PASS ``test_sub``)
graded in a fresh sandbox, on the SWE route (its default) and on the plain route
(``reward.grade_in: "fresh"``); the gold patch scores 1.0 and every attack 0.0.

Not covered (no grader that runs the policy's code in the test process can be): source code that, at
import, patches pytest's own reports or finds and rewrites the grader's report file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.protocol import Status
from tests.rollout_api.fleet import ADMIN, SUBMIT, Fleet, bearer, create_job, running_fleet, trajectories, wait_finished
from tests.sandbox_broker.conftest import needs_bwrap
from tests.sandbox_broker.images_support import pytest_repo_image

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_bwrap]

GIT_INIT = "git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
PASSING = "def test_add():\n    pass\n\n\ndef test_sub():\n    pass\n"
FORCE_PASS = (  # a pytest plugin (conftest.py or any module) that turns every report into a pass
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)
FAKE_RUN = "#!/bin/sh\necho 'PASSED tests/test_calc.py::test_add'\necho 'PASSED tests/test_calc.py::test_sub'\n"
FAKE_REPORT = '{"id": "tests/test_calc.py::test_add", "when": "call", "outcome": "passed"}'


def _write(path: str, text: str) -> str:
    return f"mkdir -p $(dirname {path}) && cat > {path} <<'EOF'\n{text}EOF\n"


ATTACKS: dict[str, str] = {
    "edit-tests": _write("tests/test_calc.py", PASSING),
    "delete-tests": "rm -rf tests\n",
    "conftest": _write("conftest.py", FORCE_PASS) + _write("tests/conftest.py", FORCE_PASS),
    "ini-plugin": _write("force_pass.py", FORCE_PASS)
    + _write("pytest.ini", "[pytest]\naddopts = -p force_pass\n")
    + _write("pyproject.toml", "[tool.pytest.ini_options]\naddopts = '-p force_pass'\n"),
    "env-plugin": _write("/opt/pydeps/force_pass.py", FORCE_PASS)
    + "echo 'export PYTEST_PLUGINS=force_pass' | tee -a /etc/profile > /root/.bashrc\n",
    "sitecustomize": _write("/opt/pydeps/force_pass.py", FORCE_PASS)
    + _write("/opt/pydeps/sitecustomize.py", "import os\nos.environ['PYTEST_PLUGINS'] = 'force_pass'\n")
    + "cp /opt/pydeps/sitecustomize.py sitecustomize.py && cp /opt/pydeps/sitecustomize.py usercustomize.py\n",
    "pth": _write("force_pass.py", FORCE_PASS)
    + _write("evil.pth", "import os; os.environ['PYTEST_PLUGINS'] = 'force_pass'\n")
    + "cp evil.pth /opt/pydeps/evil.pth\n",
    "fake-python": _write("/bin/python3", FAKE_RUN)
    + "cp /bin/python3 /bin/pytest && chmod +x /bin/python3 /bin/pytest\n",
    "symlink": _write("passing.py", PASSING) + "rm tests/test_calc.py && ln -s ../passing.py tests/test_calc.py\n",
    "markers": _write(
        "tests/test_calc.py",
        "import pytest\n\n\n@pytest.mark.xfail\ndef test_add():\n    assert 0\n\n\n"
        "@pytest.mark.skip\ndef test_sub():\n    assert 0\n",
    ),
    "report-file": "mkdir -p /tmp/rollout-grader && for n in 0 1 2; do echo "
    f"'{FAKE_REPORT}' > /tmp/rollout-grader/report-$n.jsonl; done\n"
    + _write("/tmp/rollout-grader/rollout_pytest_report.py", FORCE_PASS),
    "exit-at-import": _write("calc.py", "import os\nprint('PASSED tests/test_calc.py::test_add')\nos._exit(0)\n"),
    "background": _write("/tmp/pass.py", PASSING)
    + "(while :; do cp /tmp/pass.py tests/test_calc.py; sleep 0.05; done) >/dev/null 2>&1 &\n",
}
RULES: dict[str, list[Any]] = {
    "MODE<gold>": [f"```bash\n{_write('calc.py', FIXED)}```", SUBMIT],
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
        fleet.start_worker(concurrency=8, ROLLOUT_WORKER_RETRY_BACKOFF_S="0.1")
        yield fleet


def _swe_body(modes: list[str]) -> dict[str, Any]:
    instances = [{"instance_id": f"calc__{m}", "repo": "t/calc", "base_commit": "none",
                  "problem_statement": f"MODE<{m}>: add() subtracts", "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P}
                 for m in modes]  # fmt: skip
    return {"instances": instances, "template": "pycalc", "setup": [GIT_INIT], "test_command": TEST_COMMAND}


def _plain_body(modes: list[str]) -> dict[str, Any]:
    reward = {"command": TEST_COMMAND, "grade_in": "fresh",
              "tests": {"fail_to_pass": F2P, "pass_to_pass": P2P, "log_parser": "pytest"}}  # fmt: skip
    sandbox = {"template": "pycalc", "workdir": "/testbed", "setup": [GIT_INIT]}
    return {"tasks": [{"id": f"calc__{m}", "prompt": f"MODE<{m}>", "sandbox": sandbox, "reward": reward}
                      for m in modes]}  # fmt: skip


@pytest.mark.parametrize("route", ["/rollouts/swebench", "/rollouts"])
def test_no_attack_scores(fleet: Fleet, route: str) -> None:
    modes = ["gold", "noop", *ATTACKS]
    body = _swe_body(modes) if route.endswith("swebench") else _plain_body(modes)
    job = "tamper-swe" if route.endswith("swebench") else "tamper-plain"
    with fleet.client() as client:
        headers = create_job(client, job)
        response = client.post(route, json={"job": job, "group_size": 1, **body}, headers=headers)
        assert response.status_code == 202, response.text
        wait_finished(client, headers, response.json()["rollout_id"], timeout_s=240)
    found = {t.task_id.removeprefix("calc__"): t for t in trajectories(fleet.redis_url, job)}
    scores = {mode: (t.status, t.reward) for mode, t in found.items()}
    expected = {mode: (Status.COMPLETED, 1.0 if mode == "gold" else 0.0) for mode in modes}
    details = {m: (t.infra, t.reward_details) for m, t in found.items() if scores[m] != expected[m]}
    assert scores == expected, details
    gold = found["gold"]
    assert gold.reward_details is not None and gold.reward_details.tests == {F2P[0]: "PASSED", P2P[0]: "PASSED"}
    assert gold.timings.grade_s > 0
