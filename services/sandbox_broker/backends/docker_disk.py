"""``disk_mb`` on the docker backend: a size limit on each container's writable layer, asked of
the engine's storage driver (``--storage-opt size=``), which only some drivers can enforce.

- ``btrfs``: a qgroup per container (writes past it fail with EDQUOT, "Disk quota exceeded");
- ``zfs``: the dataset's quota;
- ``overlay2``: only on an xfs backing filesystem mounted with ``pquota`` (the engine refuses the
  option elsewhere: a create then fails loudly, never silently);
- anything else (overlay2 on ext4, vfs, fuse-overlayfs, ...): no per-container limit exists.
  The broker says so at start (a WARNING, ``/healthz`` ``disk_quota``, the metric
  ``rollout_broker_disk_quota_enforced`` 0), or, with ``docker_disk_quota=require``, refuses to
  start. The operator's fix is a data root on btrfs (``dockerd --storage-driver btrfs``) or xfs
  with ``pquota``.

The container's ``/tmp`` is a tmpfs; its pages are charged to the container's memory limit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

NONE = "none"  # the /healthz value starts with it where disk_mb is not enforced


@dataclass(frozen=True, slots=True)
class DiskQuota:
    enforced: bool
    detail: str  # /healthz ``disk_quota``

    def options(self, disk_mb: int) -> dict[str, Any]:
        """The container create arguments for ``disk_mb``."""
        return {"storage_opt": {"size": f"{disk_mb}M"}} if self.enforced else {}


def probe(info: dict[str, Any], mode: str) -> DiskQuota:
    """What the engine's storage driver (``docker info``) can enforce, under ``mode``
    (``docker_disk_quota``); raises RuntimeError when ``require`` cannot be met."""
    driver = str(info.get("Driver") or "unknown")
    status = {str(k): str(v) for k, v in info.get("DriverStatus") or []}
    backing = status.get("Backing Filesystem", "")
    if mode == "off":
        found = DiskQuota(False, f"{NONE}: off (docker_disk_quota=off)")
    elif driver in ("btrfs", "zfs"):
        found = DiskQuota(True, f"{driver} (storage-opt size)")
    elif driver == "overlay2" and backing == "xfs":
        found = DiskQuota(True, "overlay2 on xfs (storage-opt size; needs the pquota mount option)")
    else:
        why = f"the engine's storage driver {driver}" + (f" on {backing}" if backing else "")
        found = DiskQuota(False, f"{NONE}: {why} has no per-container size limit (use btrfs, zfs or xfs+pquota)")
    if not found.enforced and mode == "require":
        raise RuntimeError(f"docker_disk_quota=require, but disk_mb cannot be enforced: {found.detail}")
    if not found.enforced and mode == "auto":
        log.warning("disk_mb is NOT enforced on this docker engine: %s", found.detail)
    return found
