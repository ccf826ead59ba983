"""``reward.restore``: files and directories saved before the agent's first turn, put back before
scoring, so the agent's changes to them never count.

A path is saved as it is then: a file's bytes, a directory as a tar archive (the broker packs it),
or absent. Restoring removes whatever the agent left at each path (a file, a directory, a link)
and puts the saved one back; a path absent before stays absent. Nothing is deleted that was there
before the agent ran.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from services.protocol import ErrorCode, InfraStage
from services.protocol.sandboxes import ExecRequest
from services.rollout_api.worker.broker_client import BrokerClient
from services.rollout_api.worker.clients import InfraError


@dataclass(frozen=True, slots=True)
class Tree:
    """A directory as it was: the broker's tar archive of it."""

    tar: bytes


Saved = bytes | Tree | None  # a file's content, a directory, or absent
Snapshot = dict[str, Saved]  # absolute path -> what was there before the agent ran


async def snapshot(broker: BrokerClient, lease_id: str, paths: list[str], workdir: str) -> Snapshot:
    """Each of ``paths`` (relative to ``workdir``) as it is now."""
    taken: Snapshot = {}
    for path in paths:
        absolute = posixpath.normpath(posixpath.join(workdir, path))
        try:
            content = await broker.read_file(lease_id, absolute)
            if content is None and (tar := await broker.get_archive(lease_id, absolute)) is not None:
                taken[absolute] = Tree(tar)
            else:
                taken[absolute] = content
        except InfraError as exc:
            raise exc.at(InfraStage.REWARD, f"saving {path} for the reward") from exc
    return taken


async def restore(broker: BrokerClient, lease_id: str, saved: Snapshot, *, env: dict[str, str],
                  timeout_s: float) -> None:  # fmt: skip
    """Put every saved path back as it was."""
    if not saved:
        return
    paths = " ".join(shlex.quote(p) for p in saved)
    request = ExecRequest(shell=f"rm -rf -- {paths}", timeout_s=timeout_s, env=env, cwd="/", max_output_bytes=20_000)
    result = await broker.exec(lease_id, request, stage=InfraStage.REWARD)
    if result.exit_code != 0:
        why = "timed out" if result.timed_out else f"exited {result.exit_code}"
        message = f"clearing the restored paths {why}: {(result.stdout + result.stderr)[-300:]}"
        raise InfraError(InfraStage.REWARD, ErrorCode.INTERNAL_ERROR, message)
    try:
        for path, content in saved.items():
            if isinstance(content, Tree):
                await broker.put_archive(lease_id, path, content.tar)
            elif content is not None:
                await broker.write_file(lease_id, path, content)
    except InfraError as exc:
        raise exc.at(InfraStage.REWARD, "restoring the reward's files") from exc
