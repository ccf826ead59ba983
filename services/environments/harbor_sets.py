"""``rollout tasks import harbor DIR...``: Harbor task directories (a directory of them, or each
one) built and mapped: one image per task (harbor_images.py), one platform ``Task`` each
(harbor.py), and the broker template that names the image."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from services.environments import harbor, harbor_images
from services.protocol import Task


@dataclass
class HarborImport:
    tasks: list[Task] = field(default_factory=list)
    templates: list[dict[str, object]] = field(default_factory=list)  # POST /templates bodies
    build_s: list[float] = field(default_factory=list)  # per image
    notes: list[str] = field(default_factory=list)
    loaded: list[harbor.HarborTask] = field(default_factory=list)


def task_dirs(paths: list[Path]) -> list[Path]:
    """Each path is a task directory, or a directory of task directories (a dataset)."""
    found: list[Path] = []
    for path in paths:
        if (path / "task.toml").is_file():
            found.append(path)
        elif path.is_dir():
            found += sorted(p for p in path.iterdir() if (p / "task.toml").is_file())
        else:
            raise harbor.HarborError(f"{path}: not a Harbor task directory or a directory of them")
    if not found:
        raise harbor.HarborError(f"no task.toml under {', '.join(map(str, paths))}")
    return found


def template_name(task: harbor.HarborTask) -> str:
    return f"harbor-{task.name}"[:128]


def set_version(dirs: list[Path]) -> str:
    """A content hash of every file of the tasks: the set's version when none is given."""
    digest = hashlib.sha256()
    for directory in dirs:
        for item in sorted(directory.rglob("*")):
            if item.is_file():
                digest.update(item.relative_to(directory.parent).as_posix().encode() + b"\0" + item.read_bytes())
    return "sha256:" + digest.hexdigest()[:16]


def import_tasks(
    paths: list[Path], out: Path, cache: Path, *, bases: dict[str, str] | None = None, network: bool = False,
    host_usr: bool = False, source_version: str | None = None, store_names: dict[str, str] | None = None,
) -> HarborImport:  # fmt: skip
    """Load, build and map every task; HarborError or RecipeError name the task that cannot be."""
    dirs = task_dirs(paths)
    version = source_version or set_version(dirs)
    result = HarborImport()
    for directory in dirs:
        task = harbor.load(directory)
        timeout = float(task.section("environment").get("build_timeout_sec", 600.0))
        try:
            image = harbor_images.build(task.environment, out / "images" / task.name, cache, bases or {},
                                        network=network, timeout_s=timeout, store_names=store_names)  # fmt: skip
        except ValueError as exc:
            raise harbor.HarborError(f"{task.name}: {exc}") from exc
        template = template_name(task)
        result.templates.append({"name": template, "image": str(image.path), "host_usr": host_usr})
        result.tasks.append(harbor.to_task(task, template, version))
        result.build_s.append(image.build_s)
        result.notes += task.notes + [f"{task.name}: {note}" for note in image.notes]
        result.loaded.append(task)
    return result
