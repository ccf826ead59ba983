"""The work stream's entries (``keys.work_stream``) and its dead letters (``keys.dead_letters``).

Each field below says who writes it and who reads it. An entry is written by the API's ``admit``
script, one per trajectory, and read by the workers. The API's cancellation also reads it, to
drop a rollout's undelivered entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# -- fields of a work entry -------------------------------------------------------------------
ROLLOUT = "rollout"  # the rollout id: cancellation filters on it without decoding the item
TRAJECTORY = "trajectory"  # the trajectory id, readable with XRANGE (the item carries it too)
ITEM = "item"  # ``WorkItem.encode()``: the item without its task (the task is stored per rollout)
ENTRY_FIELDS = (ROLLOUT, TRAJECTORY, ITEM)  # in the order the admit script writes them

# -- fields a dead letter adds to the entry's own ----------------------------------------------
DEAD_REASON = "dead_reason"  # why the entry was taken out of play: one of the ``DEAD_*`` reasons below
DEAD_ERROR = "dead_error"  # the last error met while processing it (its first line, at most 500 characters)
DEAD_ENTRY = "dead_entry"  # the entry's id on the work stream
DEAD_DELIVERIES = "dead_deliveries"  # how many times the entry had been delivered to a worker

# -- reasons (written by the worker that moves the entry) --------------------------------------
UNDECODABLE = "undecodable"  # the entry or its stored task cannot be decoded
FAILED = "failed"  # processing it failed outside its attempts (publishing or acknowledging it)
REDELIVERED = "redelivered"  # delivered more times than the workers' ``max_deliveries``
DEAD_REASONS = (UNDECODABLE, FAILED, REDELIVERED)


@dataclass(frozen=True, slots=True)
class WorkEntry:
    """A work entry as read with a client that does not decode responses."""

    rollout_id: str  # "" when the entry has none
    item: bytes  # b"" when the entry has none (decoding it then fails: a dead letter)

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> WorkEntry:
        return cls(rollout_id=fields.get(ROLLOUT.encode(), b"").decode(), item=fields.get(ITEM.encode(), b""))


def dead_letter_fields(
    fields: Mapping[bytes, bytes], reason: str, entry_id: bytes, *, error: str = "", deliveries: int = 0
) -> dict[bytes, bytes]:
    """A dead letter: the entry's own fields as they were, its reason, last error, id and deliveries."""
    return {
        **fields, DEAD_REASON.encode(): reason.encode(), DEAD_ERROR.encode(): error.encode(),
        DEAD_ENTRY.encode(): entry_id, DEAD_DELIVERIES.encode(): str(deliveries).encode(),
    }  # fmt: skip
