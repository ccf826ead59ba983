"""Before engines switch weights, each engine's host fetches the export (from a shared path or a
weight store URL) into its own disk and verifies the trainer's checksum; the engine then loads the
local copy. Engines registered without a staging route load the location as it is (a path every
host shares), as before weight stores existed."""

from __future__ import annotations

from services.llm_proxy.membership import EngineRecord
from services.llm_proxy.upstream import EngineClient
from services.protocol.weights import STAGE_WEIGHTS_PATH


class StageFailed(Exception):
    """The engine's host could not fetch or verify the export."""


async def stage(client: EngineClient, record: EngineRecord, location: str, checksum: str | None) -> str:
    """The path ``record``'s engine loads ``location`` from."""
    if record.stage_url is None or checksum is None:
        if "://" in location:
            raise StageFailed(f"engine {record.engine_id} has no staging route, so it cannot load {location}")
        return location
    status, doc = await client.call(
        "POST", record.stage_url + STAGE_WEIGHTS_PATH, {"location": location, "checksum": checksum}
    )
    if status != 200 or not (isinstance(doc, dict) and doc.get("success") and isinstance(doc.get("path"), str)):
        raise StageFailed(f"stage_weights: {status} {doc}")
    return str(doc["path"])
