"""A proxy worker's cyclic GC: start-up objects frozen, young collections at the configured threshold."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from services.llm_proxy.server import tune_gc
from services.llm_proxy.settings import ProxySettings


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_gc_freezes_the_heap_and_raises_the_young_threshold(restored_gc: None) -> None:
    gc.unfreeze()
    _, middle, old = gc.get_threshold()
    tune_gc(123_456)
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (123_456, middle, old)


def test_zero_turns_automatic_collection_off(restored_gc: None) -> None:
    tune_gc(0)
    assert gc.get_threshold()[0] == 0
    assert gc.isenabled()  # gc.collect() still works; only the automatic trigger is off


def test_the_default_threshold_is_far_above_pythons() -> None:
    assert ProxySettings.model_fields["gc_young_threshold"].default >= 50_000
