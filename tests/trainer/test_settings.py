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
