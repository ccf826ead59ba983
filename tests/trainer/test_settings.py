"""ROLLOUT_TRAIN_* settings, nested sections included."""

from __future__ import annotations

import pytest

from trainer_client.settings import TrainSettings

pytestmark = [pytest.mark.trainer]


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_JOB", "job7")
    monkeypatch.setenv("ROLLOUT_TRAIN_MODEL__HIDDEN_SIZE", "256")
    monkeypatch.setenv("ROLLOUT_TRAIN_LOSS", '{"tis_cap": 3.0, "kl_coef": 0.01}')
    monkeypatch.setenv("ROLLOUT_TRAIN_MAX_STALENESS", "4")
    s = TrainSettings()
    assert (s.job, s.model.hidden_size, s.model.num_layers) == ("job7", 256, 2)
    assert (s.loss.tis_cap, s.loss.kl_coef, s.max_staleness) == (3.0, 0.01, 4)
    assert s.step_log == s.work_dir / "steps.jsonl"


def test_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_OVERPROVISION", "0.5")
    with pytest.raises(ValueError, match="overprovision"):
        TrainSettings()


def test_the_job_pool_is_stored_once() -> None:
    """The pool weights go to is the job's (``JobCreate.pool``); the trainer's setting must agree."""
    from rollout_client.weights import job_pool

    assert job_pool("j", None, "gpu-a") == "gpu-a"  # read back from the API
    assert job_pool("j", "gpu-a", "gpu-a") == "gpu-a"
    assert job_pool("j", "gpu-b", None) == "gpu-b"  # no API: the setting
    assert job_pool("j", None, None) == "default"
    with pytest.raises(ValueError, match="'gpu-b' but job 'j' is served by pool 'gpu-a'"):
        job_pool("j", "gpu-b", "gpu-a")
