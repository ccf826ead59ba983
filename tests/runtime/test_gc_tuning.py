"""Every serving process's cyclic GC: start-up objects frozen, young collections at the configured
threshold (services/runtime/gc_tuning.py), set by the proxy's workers, the broker, the API and the
rollout workers once they have started."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.llm_proxy.settings import ProxySettings
from services.rollout_api import app as api_app
from services.rollout_api.settings import ApiSettings, WorkerSettings
from services.rollout_api.worker import main as worker_main
from services.rollout_api.worker.worker import Worker
from services.runtime.gc_tuning import tune_gc
from services.runtime.settings import TunesGc
from services.runtime.tokenizer import write_tokenizer_dir
from services.sandbox_broker import app as broker_app
from services.sandbox_broker.settings import BrokerSettings

NOWHERE = "http://127.0.0.1:9"  # never called


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_gc_freezes_the_heap_and_raises_the_young_threshold(restored_gc: None) -> None:
    _, middle, old = gc.get_threshold()
    tune_gc(123_456)
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (123_456, middle, old)


def test_zero_turns_automatic_collection_off(restored_gc: None) -> None:
    tune_gc(0)
    assert gc.get_threshold()[0] == 0
    assert gc.isenabled()  # gc.collect() still works; only the automatic trigger is off


@pytest.mark.parametrize("cls", [ProxySettings, BrokerSettings, ApiSettings, WorkerSettings])
def test_every_serving_process_has_the_setting_far_above_pythons_default(cls: type[TunesGc]) -> None:
    assert issubclass(cls, TunesGc)
    assert cls.model_fields["gc_young_threshold"].default >= 50_000
    assert cls.variable("gc_young_threshold").endswith("_GC_YOUNG_THRESHOLD")


def _frozen_at(threshold: int) -> bool:
    return gc.get_threshold()[0] == threshold and gc.get_freeze_count() > 0


async def test_the_api_tunes_its_gc_once_started(restored_gc: None, redis_url: str) -> None:
    app = api_app.create_app(ApiSettings(gc_young_threshold=54_321, broker_url=NOWHERE), redis_url)
    assert not _frozen_at(54_321)
    async with app.router.lifespan_context(app):
        assert _frozen_at(54_321)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    tmp_path.chmod(0o711)  # the sandbox uid passes through, as the broker's own state directory
    return tmp_path / "state"


async def test_the_broker_tunes_its_gc_once_started(restored_gc: None, redis_url: str, state_dir: Path) -> None:
    settings = BrokerSettings(gc_young_threshold=43_210, backend="local", state_dir=state_dir, service_token="s",
                              allow_unisolated=True)  # fmt: skip
    app = broker_app.create_app(settings, redis_url)
    assert not _frozen_at(43_210)
    async with app.router.lifespan_context(app):
        assert _frozen_at(43_210)


async def test_a_rollout_worker_tunes_its_gc_once_started(
    restored_gc: None, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []

    async def run(self: Any) -> None:  # the worker's loop: started with its GC already tuned
        seen.append(_frozen_at(32_101))

    monkeypatch.setattr(Worker, "run", run)
    settings = WorkerSettings(gc_young_threshold=32_101, redis_url=redis_url, proxy_url=NOWHERE, broker_url=NOWHERE,
                              model_path=write_tokenizer_dir(tmp_path / "model"))  # fmt: skip
    await worker_main.serve(settings, redis_url)
    assert seen == [True]
