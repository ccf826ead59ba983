"""SWE instance files of all four formats over tasks the project's builder makes from real PyPI
libraries (``rollout tasks build``: inflection, whose test file sits at the sdist's root, and
cachetools, a src layout whose test package imports itself), through the SWE route end to end
(real API, worker, proxy, scripted engine, broker with local sandboxes). Each format's rows name the
images that format's harness expects (SWE-smith: the library's fixed tree with the bug as the row's
patch; R2E-Gym: ``/r2e_tests`` and ``run_tests.sh``). The gold patch scores 1 and a no-op 0 on
every row, and each row is imported with the FAIL_TO_PASS / PASS_TO_PASS the builder found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.benchmarks import swe_formats
from services.environments.swe_built_rows import FORMATS, expected_tests
from services.environments.swe_files import import_files
from services.protocol import Status
from services.taskbuild.builder import TEST_COMMAND, build
from tests.rollout_api.fleet import ADMIN, SUBMIT, Fleet, create_job, running_fleet, trajectories, wait_finished
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_bwrap, pytest.mark.timeout(600)]  # builds from PyPI first

TASKS = ["inflection-dasherize", "cachetools-lru-order"]
CACHE = Path.home() / ".cache" / "rollout" / "tasks"  # `rollout tasks build`'s: sdists, base and deps layers
JOB = "swe-built"


def marker(task: str, mode: str) -> str:
    return f"RUN-MODE {mode} {task}."


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return build(tmp_path_factory.mktemp("built"), CACHE, only=TASKS)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, built: list[dict[str, Any]]) -> Iterator[Fleet]:
    rules: dict[str, list[Any]] = {}
    for instance in built:
        gold = f"```bash\ncat > /tmp/gold.patch <<'EOF'\n{instance['patch']}EOF\ngit apply /tmp/gold.patch\n```"
        rules |= {marker(instance["instance_id"], "gold"): [gold, SUBMIT],
                  marker(instance["instance_id"], "noop"): [SUBMIT]}  # fmt: skip
    with running_fleet(tmp_path_factory.mktemp("swe-built"), rules, "swe-built") as fleet:
        fleet.start_worker(concurrency=8)
        yield fleet


def test_every_format_over_built_tasks_scores_gold_1_and_noop_0(fleet: Fleet, built: list[dict[str, Any]]) -> None:
    # rows and derived images beside the built tasks (under the broker's template root, /tmp)
    prepared = swe_formats.prepare(built, list(FORMATS), lambda instance, mode: marker(instance["instance_id"], mode))
    by_id = prepared.instances
    bodies = []
    for fmt, path in prepared.files.items():
        imported = import_files([path], fmt, job=JOB, group_size=1, test_command=TEST_COMMAND,
                                limits={"max_turns": 4})  # fmt: skip
        assert imported.notes == []
        bodies += [request.model_dump(mode="json") for request in imported.requests]
    assert len(prepared.images) == 2 + 2 + 2  # the tasks' own, one SWE-smith snapshot per library, one R2E-Gym each
    swe_formats.register(fleet.broker.url, ADMIN, prepared)  # each template's POST must succeed
    with fleet.client() as client:
        headers = create_job(client, JOB)
        accepted = [client.post("/rollouts/swebench", json=body, headers=headers) for body in bodies]
        assert [r.status_code for r in accepted] == [202] * len(bodies), [r.text for r in accepted]
        for response in accepted:
            wait_finished(client, headers, response.json()["rollout_id"], timeout_s=400)
    found = trajectories(fleet.redis_url, JOB)
    assert len(found) == len(FORMATS) * len(TASKS) * 2
    outcomes, tests, details = {}, {}, {}
    for traj in found:
        task = next(t for t in TASKS if t in traj.task_id)
        key = (traj.source, task, traj.task_id.rsplit(".", 1)[-1])
        outcomes[key], details[key] = (traj.status, traj.reward), traj.infra or traj.reward_details
        tests[(traj.source, task)] = (traj.metadata["FAIL_TO_PASS"], traj.metadata["PASS_TO_PASS"])
        assert traj.reward_details is not None and set(traj.reward_details.tests) >= set(traj.metadata["FAIL_TO_PASS"])
    wanted = {(fmt, task, mode): (Status.COMPLETED, float(mode == "gold"))
              for fmt in FORMATS for task in TASKS for mode in ("gold", "noop")}  # fmt: skip
    assert outcomes == wanted, details
    assert tests == {(fmt, task): expected_tests(by_id[task], fmt) for fmt in FORMATS for task in TASKS}
