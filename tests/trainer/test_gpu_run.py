"""The GPU script's settings parse on CPU (the script itself needs CUDA GPUs and is run by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.gpu_run import parse, settings_env
from tests.trainer.launch import torchrun_argv
from trainer_client.settings import TrainSettings

pytestmark = [pytest.mark.trainer]


@pytest.mark.parametrize("argv", [["--nproc", "8", "--tp", "2"], ["--cpu", "--nproc", "2", "--tp", "1"]])
def test_gpu_script_settings_parse(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str]) -> None:
    args = parse([*argv, "--out", str(tmp_path)])
    env = settings_env(args, "redis://127.0.0.1:1/0", "http://127.0.0.1:2", tmp_path / "t.jsonl", tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = TrainSettings()
    assert s.parallel.tensor_parallel == args.tp and args.nproc % args.tp == 0
    assert s.model.num_attention_heads % args.tp == 0 and s.model.num_query_groups % args.tp == 0
    assert s.model.vocab_size % args.tp == 0  # Megatron splits the vocabulary evenly
    assert s.packing and s.optim.warmup_steps == 2 and s.work_dir == tmp_path
    assert s.parallel.recompute_activations is not args.cpu
    assert torchrun_argv(args.nproc, "trainer_client.main")[3:5] == ["--nproc-per-node", str(args.nproc)]
