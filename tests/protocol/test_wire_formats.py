"""The small wire formats of the contract: work entries, dead letters, attempt keys, weight versions."""

from __future__ import annotations

from services.protocol import work
from services.protocol.trajectory import attempt_key
from services.protocol.weights import INITIAL_VERSION, parse_version_label, version_label


def test_a_work_entry_reads_its_rollout_and_item() -> None:
    fields = {b"rollout": b"r1", b"trajectory": b"r1:t:0", b"item": b"{}"}
    entry = work.WorkEntry.from_fields(fields)
    assert (entry.rollout_id, entry.item) == ("r1", b"{}")
    assert work.WorkEntry.from_fields({}) == work.WorkEntry("", b"")  # a broken entry: decoding fails later
    dead = work.dead_letter_fields(fields, work.UNDECODABLE, b"1-0", error="bad json", deliveries=2)
    assert dead == {**fields, b"dead_reason": b"undecodable", b"dead_error": b"bad json", b"dead_entry": b"1-0",
                    b"dead_deliveries": b"2"}  # fmt: skip


def test_attempt_key() -> None:
    assert attempt_key("r:t:3", 2) == "r:t:3#2"


def test_weight_version_labels_round_trip() -> None:
    assert version_label(0, 4) == INITIAL_VERSION == "0"
    assert version_label(5, 3) == "5-e3" and parse_version_label("5-e3") == (5, 3)
    assert parse_version_label(INITIAL_VERSION) is None and parse_version_label("default") is None
