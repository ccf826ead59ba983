"""``rollout bench swe --formats``: the shipped tasks as instance files of each SWE format
(services/environments/swe_built_rows.py), imported by ``rollout tasks import swe``'s importer and
run on the SWE route in the gold and no-op modes. Per format: the reward means, and the share of
rows imported with the FAIL_TO_PASS / PASS_TO_PASS the builder found (``tests_match``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.environments.swe_built_rows import FORMATS, expected_tests, row
from services.environments.swe_files import import_files
from services.environments.swe_fixtures import write_jsonl
from services.protocol import Trajectory
from services.rollout_api.swebench import template_for

MODES = ("gold", "noop")


@dataclass
class Prepared:
    """Per format, its instance file; the templates its rows' images need."""

    files: dict[str, Path] = field(default_factory=dict)
    images: dict[str, Path] = field(default_factory=dict)  # template -> image layout
    instances: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> tasks.json record


def parse(value: str) -> list[str]:
    """``--formats``: a comma-separated list, or ``all``."""
    names = list(FORMATS) if value.strip() == "all" else [f.strip() for f in value.split(",") if f.strip()]
    if unknown := sorted(set(names) - set(FORMATS)):
        raise SystemExit(f"--formats: unknown {', '.join(unknown)} (choose from all, {', '.join(FORMATS)})")
    return names


def prepare(instances: list[dict[str, Any]], formats: list[str], marker: Any) -> Prepared:
    """Each format's rows (one per task and mode; ``marker(instance, mode)`` ends the problem
    statement, so the scripted engine knows the mode), written beside the built tasks with the
    derived images."""
    tasks_dir = Path(instances[0]["image_path"]).parents[1]
    out, blobs = tasks_dir / "derived", tasks_dir / "blobs"
    out.mkdir(exist_ok=True)
    prepared = Prepared(instances={i["instance_id"]: i for i in instances})
    for fmt in formats:
        rows = []
        for instance in instances:
            for mode in MODES:
                problem = f"{instance['problem_statement']}\n\n{marker(instance, mode)}"
                made, image, path = row(instance, fmt, out, blobs, problem)
                rows.append({**made, "instance_id": f"{made['instance_id']}.{mode}"})
                prepared.images[template_for(image)] = path
        prepared.files[fmt] = write_jsonl(out / f"{fmt}.jsonl", rows)
    return prepared


def register(broker: str, admin: str, prepared: Prepared) -> None:
    with httpx.Client(base_url=broker, timeout=120, headers={"Authorization": f"Bearer {admin}"}) as http:
        for name, path in prepared.images.items():
            http.post("/templates", json={"name": name, "image": str(path)}).raise_for_status()


def submit(api: str, headers: dict[str, str], job: str, path: Path, fmt: str, test_command: str) -> list[str]:
    """The file's rollouts (one per format: the importer's request bodies), as the CLI would post them."""
    imported = import_files([path], fmt, job=job, group_size=1, test_command=test_command,
                            limits={"max_turns": 5, "command_timeout_s": 300})  # fmt: skip
    with httpx.Client(base_url=api, timeout=60, headers=headers) as http:
        posted = [http.post("/rollouts/swebench", json=r.model_dump(mode="json")) for r in imported.requests]
    for response in posted:
        response.raise_for_status()
    return [response.json()["rollout_id"] for response in posted]


def task_of(prepared: Prepared, traj: Trajectory) -> tuple[dict[str, Any], str]:
    """The tasks.json record a trajectory's row came from, and its mode (the id's suffix)."""
    stem, _, mode = traj.task_id.rpartition(".")
    task = next(t for t in sorted(prepared.instances, key=len, reverse=True) if t in stem)
    return prepared.instances[task], mode


def summary(prepared: Prepared, found: dict[str, list[Trajectory]]) -> dict[str, Any]:
    """``formats``: format -> reward means per mode, episodes, infra errors and ``tests_match``;
    ``formats_ok``: the formats whose gold mean is 1, no-op mean 0, infra errors 0, tests_match 1."""
    figures: dict[str, Any] = {}
    for fmt, episodes in found.items():
        by_mode: dict[str, list[float]] = {mode: [] for mode in MODES}
        matched = []
        for traj in episodes:
            instance, mode = task_of(prepared, traj)
            if traj.status.trainable and traj.reward is not None:
                by_mode[mode].append(traj.reward)
            imported = (traj.metadata.get("FAIL_TO_PASS"), traj.metadata.get("PASS_TO_PASS"))
            matched.append(imported == expected_tests(instance, fmt))
        figures[fmt] = {
            "episodes": len(episodes),
            "infra_errors": sum(1 for t in episodes if t.status.value == "infra_error"),
            **{f"{mode}_reward_mean": round(statistics.fmean(v), 4) if v else None for mode, v in by_mode.items()},
            "tests_match": round(statistics.fmean(matched), 4) if matched else None,
        }
    ok = [fmt for fmt, f in figures.items()
          if (f["gold_reward_mean"], f["noop_reward_mean"], f["infra_errors"], f["tests_match"]) == (1.0, 0.0, 0, 1.0)
          and f["episodes"] == len(prepared.instances) * len(MODES)]  # fmt: skip
    return {"formats": figures, "formats_ok": ok}
