"""The dashboard in a real browser: start the fleet (real processes), run a few rollouts, open the
page in headless Chromium, check that its figures are the API's answers and that the viewer shows
a trajectory's commands and reward; screenshots go to the test's output directory."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboard.browser import chromium, screenshot, wait_until
from tests.rollout_api.fleet import (
    ADMIN,
    SUBMIT,
    Fleet,
    bearer,
    create_job,
    running_fleet,
    submit,
    task,
    wait_finished,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RULES: dict[str, list[Any]] = {
    "TASK-SOLVE": ["THOUGHT: write it\n```bash\necho 42 > answer.txt\n```", f"THOUGHT: done\n{SUBMIT}"],
    "TASK-WRONG": ["THOUGHT: guess\n```bash\necho 41 > answer.txt\n```", SUBMIT],
    "TASK-LOOP": ["THOUGHT: look\n```bash\nls -la\n```"],
}
JOB = "dash"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("dash-fleet"), RULES, "dash") as fleet:
        fleet.start_worker(jobs=[JOB], concurrency=8)
        yield fleet


def fixed(value: float | None, digits: int, scale: float = 1.0) -> str:
    """JavaScript's ``(value * scale).toFixed(digits)`` (ties away from zero); a dash for null."""
    if value is None:
        return "–"
    return str(Decimal(value * scale).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def integer(value: float | None) -> str:
    return "–" if value is None else f"{int(Decimal(value).quantize(Decimal(1), rounding=ROUND_HALF_UP)):,}"


def expected_kpis(status: dict[str, Any]) -> dict[str, str]:
    tail = status["tail"]
    return {
        "trajectories_per_hour": integer(status["trajectories_per_hour"]),
        "in_flight": integer(status["in_flight"]),
        "queue_depth": integer(status["queue_depth"]),
        "finished": integer(status["finished"]),
        "episode_p50_s": fixed(tail["episode_p50_s"], 2),
        "episode_p99_s": fixed(tail["episode_p99_s"], 2),
        "tail_share_after_90pct": fixed(tail["tail_share_after_90pct"], 1, 100),
        "turn_cap_hit_rate": fixed(tail["turn_cap_hit_rate"], 1, 100),
        "infra_error_rate": fixed(status["infra_error_rate"], 1, 100),
    }


# One read of the page in the browser (the page re-renders every poll: element handles go stale).
SNAPSHOT_JS = """
const panel = document.querySelector(`section.job[data-job="${arguments[0]}"]`);
if (!panel) return null;
const texts = (sel, key, value) => Object.fromEntries([...panel.querySelectorAll(sel)].map(
  (n) => [n.dataset[key], n.querySelector(value).textContent]));
return {
  kpis: texts(".kpi", "kpi", ".kpi-value"),
  statuses: texts("[data-status-count]", "statusCount", ".num"),
  engines: [...document.querySelectorAll("#engines-table tbody tr")].map((r) => r.dataset.engine),
};
"""


DETAIL_JS = """
const head = document.querySelector("#detail .detail-head");
const reward = document.querySelector("#detail .reward [data-reward]");
return head && {
  trajectory: head.dataset.trajectory,
  status: head.querySelector("[data-status]").dataset.status,
  commands: [...document.querySelectorAll("#detail pre.command")].map((n) => n.textContent),
  reward: reward && [reward.dataset.reward, reward.textContent],
  fact: document.querySelector('#detail [data-fact="reward"]').textContent,
  turns: document.querySelectorAll("#detail .turn").length,
  heat: document.querySelectorAll("#detail .tokens .tok:not(.masked)").length,
};
"""


def detail_of(driver: Any, task_id: str) -> Any:
    def shown(d: Any) -> Any:
        found = d.execute_script(DETAIL_JS)
        return found if found and f":{task_id}:" in found["trajectory"] else None

    return wait_until(driver, f"the trajectory of task {task_id}", shown)


def snapshot(driver: Any, job: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = driver.execute_script(SNAPSHOT_JS, job)
    return found


def click(driver: Any, css: str) -> None:
    """Click the first element matching ``css``, finding it again if a re-render replaced it."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def clicked(d: Any) -> bool:
        try:
            found = d.find_elements(By.CSS_SELECTOR, css)
            if found:
                found[0].click()
            return bool(found)
        except StaleElementReferenceException:
            return False

    wait_until(driver, css, clicked)


@pytest.mark.timeout(300)  # the fleet's start-up alone takes 60-100 s on a 2-core machine under others' load
def test_dashboard_matches_the_api_and_shows_trajectories(fleet: Fleet, tmp_path: Path) -> None:
    with fleet.client() as client:
        run_and_check(fleet, client, tmp_path)


def run_and_check(fleet: Fleet, client: httpx.Client, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    headers = create_job(client, JOB)
    tasks = [task("solve", "TASK-SOLVE"), task("wrong", "TASK-WRONG"), task("loop", "TASK-LOOP")]
    rollout = submit(client, headers, {"job": JOB, "tasks": tasks, "group_size": 2, "limits": {"max_turns": 3}})
    wait_finished(client, headers, rollout, timeout_s=90)
    status = client.get(f"/jobs/{JOB}", headers=headers).json()
    engines = httpx.get(fleet.proxy.url + "/admin/status", headers=bearer(ADMIN), timeout=10).json()
    shots = tmp_path / "screenshots"

    driver = chromium()
    try:
        driver.get(f"{fleet.api.url}/ui/#token={ADMIN}")
        wanted = expected_kpis(status)

        def matching(d: Any) -> dict[str, Any] | None:
            shown = snapshot(d, JOB)
            return shown if shown and all(shown["kpis"].get(n) == v for n, v in wanted.items()) else None

        shown = wait_until(driver, f"the API's figures {wanted}", matching)
        assert {n: shown["kpis"][n] for n in wanted} == wanted
        assert shown["statuses"] == {state: integer(count) for state, count in status["by_status"].items()}
        assert set(shown["engines"]) == {e["engine_id"] for pool in engines["pools"].values() for e in pool["engines"]}
        wait_until(driver, "the charts", lambda d: d.find_elements(By.CSS_SELECTOR, f"#chart-load-{JOB} canvas"))
        fleet_png = screenshot(driver, shots, "dashboard-fleet")

        driver.get(f"{fleet.api.url}/ui/#/trajectories/{JOB}")
        click(driver, '#traj-table tr[data-trajectory*=":solve:"]')
        solved = detail_of(driver, "solve")
        assert solved["commands"] == ["echo 42 > answer.txt", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
        assert solved["reward"] == ["1", "1.00"] and solved["fact"] == "1.00"
        assert solved["heat"] > 0, "no heat-map tokens"
        viewer_png = screenshot(driver, shots, "viewer-solved")

        click(driver, '#traj-table tr[data-trajectory*=":loop:"]')
        looped = detail_of(driver, "loop")
        assert looped["status"] == "truncated" and looped["turns"] == 3
        assert looped["commands"] == ["ls -la"] * 3
        truncated_png = screenshot(driver, shots, "viewer-truncated")
    finally:
        driver.quit()
    print(f"\nscreenshots: {fleet_png} {viewer_png} {truncated_png}")
    for png in (fleet_png, viewer_png, truncated_png):
        assert png.stat().st_size > 10_000
    assert client.get("/ui/api/overview").status_code == 401
    assert client.get("/ui/api/overview", headers=bearer("wrong")).status_code == 401
