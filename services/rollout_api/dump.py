"""Dumps of a job's trajectories: JSON lines, one ``trajectory_to_json`` record per line (``.gz`` too),
or one ATIF document per line (``fmt="atif"``: Harbor's trajectory format, ``services.protocol.atif``).

``export_job`` reads the job's trajectory stream oldest first with XRANGE (no consumer group, so a
trainer's group is untouched); ``import_dump`` appends a dump to a job's stream, so a trainer can
be re-run on recorded data or a run inspected in the viewer. ``read_dump`` feeds replays.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
import redis
from pydantic_settings import SettingsConfigDict

from services.protocol import Trajectory, from_stream_fields, keys, to_stream_fields, trajectory_from_json
from services.protocol import trajectory_to_json as to_json
from services.protocol.atif import AtifTrajectory, from_atif, to_atif
from services.runtime.settings import UsesRedis

PAGE = 500


class DumpSettings(UsesRedis):
    """``ROLLOUT_TRAJECTORIES_*``: ``rollout trajectories export|import`` (Redis as every service resolves it)."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_TRAJECTORIES_")
    service_name = "rollout trajectories"


def _open(path: Path, mode: str) -> IO[bytes]:
    return gzip.open(path, mode + "b") if path.suffix == ".gz" else path.open(mode + "b")  # type: ignore[return-value]


def stream_entries(client: redis.Redis, job: str, mode: str = "train") -> Iterator[tuple[str, Trajectory]]:
    """(entry id, trajectory) of the job's stream (``mode="eval"``: its evaluation stream), oldest
    first, read in pages."""
    low = "-"
    while True:
        batch: Any = client.xrange(keys.rollout_stream(job, mode), min=low, max="+", count=PAGE)
        for entry_id, fields in batch:
            yield entry_id.decode(), from_stream_fields(fields)
        if len(batch) < PAGE:
            return
        low = "(" + batch[-1][0].decode()


FORMATS = ("jsonl", "atif")


def atif_line(traj: Trajectory) -> bytes:
    """One trajectory as an ATIF document (one JSON line)."""
    return to_atif(msgspec.json.decode(to_json(traj))).model_dump_json(exclude_none=True).encode()


def export_job(client: redis.Redis, job: str, out: Path, fmt: str = "jsonl") -> int:
    """Write every trajectory of ``job`` to ``out`` (``fmt``: one of ``FORMATS``); returns how many."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown dump format {fmt!r}: one of {FORMATS}")
    count = 0
    with _open(out, "w") as f:
        for _, traj in stream_entries(client, job):
            f.write((atif_line(traj) if fmt == "atif" else to_json(traj)) + b"\n")
            count += 1
    return count


def _record(line: bytes) -> Trajectory:
    """A dump line: a trajectory record, or an ATIF document (it has ``schema_version``)."""
    if b'"schema_version"' in line[:200]:
        doc = AtifTrajectory.model_validate_json(line)
        return trajectory_from_json(msgspec.json.encode(from_atif(doc)))
    return trajectory_from_json(line)


def read_dump(path: Path) -> Iterator[Trajectory]:
    with _open(path, "r") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield _record(line)
                except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
                    raise ValueError(f"{path}:{number}: not a trajectory record: {exc}") from exc


def import_dump(client: redis.Redis, path: Path, job: str | None = None, maxlen: int = 100_000) -> int:
    """Append every record of ``path`` to the trajectory stream of its job (or of ``job``); returns how many.

    Records are checked (``Trajectory.check``) before anything is written, so a bad dump writes nothing.
    """
    for traj in read_dump(path):  # a first pass checks everything before anything is written
        traj.check()
    written = 0
    pipe = client.pipeline(transaction=False)
    for traj in read_dump(path):
        target = traj if job is None else msgspec.structs.replace(traj, job=job)
        fields: Any = to_stream_fields(target)
        pipe.xadd(keys.trajectory_stream(target.job), fields, maxlen=maxlen, approximate=True)
        written += 1
        if written % PAGE == 0:
            pipe.execute()
    pipe.execute()
    return written
