"""SWE instance files of all four formats through the SWE route end to end (real API, worker,
proxy, scripted engine, broker with local sandboxes): the gold agent scores 1 and the no-op 0 on
each, by the rows' own FAIL_TO_PASS / PASS_TO_PASS, and every trajectory records its source."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.environments.swe_files import import_files
from services.protocol import Status
from tests.environments.swe_rows import GIT_INIT, ROWS, TEST_COMMAND, calc_images, write_jsonl
from tests.rollout_api.fleet import (
    ADMIN,
    SUBMIT,
    Fleet,
    bearer,
    create_job,
    running_fleet,
    trajectories,
    wait_finished,
)
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_bwrap, pytest.mark.timeout(300)]  # a fleet starts first

FIXED = "def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a - b\\n"
GOLD = f"```bash\nprintf '{FIXED}' > calc.py\n```"
RULES: dict[str, list[Any]] = {"MODE-GOLD": [GOLD, SUBMIT], "MODE-NOOP": [SUBMIT]}
ENV = {"PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("swe-sources"), RULES, "swe-sources") as fleet:
        for name, path in calc_images(fleet.state_dir / "img").items():
            template = {"name": name, "image": str(path), "host_usr": True}
            made = httpx.post(f"{fleet.broker.url}/templates", json=template, headers=bearer(ADMIN))
            assert made.status_code == 201, made.text
        fleet.start_worker(concurrency=8)
        yield fleet


def test_every_format_scores_gold_1_and_noop_0_with_its_source(fleet: Fleet, tmp_path: Path) -> None:
    files = {fmt: write_jsonl(tmp_path / f"{fmt}.jsonl", [rows("GOLD"), rows("NOOP")]) for fmt, rows in ROWS.items()}
    bodies = []
    for fmt, path in files.items():
        template = "calc-r2e" if fmt == "r2e-gym" else "calc"
        imported = import_files([path], fmt, job="swe-sources", group_size=1, template=template,
                                test_command=TEST_COMMAND, env=ENV, setup=[GIT_INIT])  # fmt: skip
        bodies += [request.model_dump(mode="json") for request in imported.requests]
    with fleet.client() as client:
        headers = create_job(client, "swe-sources")
        accepted = [client.post("/rollouts/swebench", json=body, headers=headers) for body in bodies]
        assert [r.status_code for r in accepted] == [202] * len(bodies), [r.text for r in accepted]
        for response in accepted:  # the four rollouts run side by side
            wait_finished(client, headers, response.json()["rollout_id"], timeout_s=200)
    found = {(t.source, t.task_id[-4:]): t for t in trajectories(fleet.redis_url, "swe-sources")}
    outcomes = {key: (t.status, t.reward) for key, t in found.items()}
    wanted = {(fmt, mode): (Status.COMPLETED, float(mode == "gold")) for fmt in ROWS for mode in ("gold", "noop")}
    assert outcomes == wanted, {key: t.infra or t.reward_details for key, t in found.items()}
    for (fmt, _), traj in found.items():
        assert traj.source_version.startswith("sha256:") and traj.metadata["source"] == fmt
        assert traj.timings.grade_s > 0  # graded in a fresh sandbox from the agent's diff (the route's default)
        details = traj.reward_details
        assert details is not None and set(details.tests) >= set(traj.metadata["FAIL_TO_PASS"])
