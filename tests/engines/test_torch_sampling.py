"""The torch engine's batched sampler: per-row temperature, top-p and generator, drawn together."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from services.engines.torch_model import _Request, _Sampler  # noqa: E402  (torch first)

PROBS = [0.5, 0.3, 0.2, 0.0]  # the last token can never be drawn


def request(temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None) -> _Request:
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return _Request([1], 8, temperature, top_p, set(), generator)


def logits(rows: int) -> Any:  # a torch.Tensor (torch is imported only where installed)
    return torch.tensor([[math.log(p) if p else -math.inf for p in PROBS]] * rows)


def frequencies(sampler: _Sampler, rows: int, rounds: int = 1) -> dict[int, float]:
    counts: Counter[int] = Counter()
    for _ in range(rounds):
        counts.update(sampler.pick(logits(rows)).tolist())
    return {token: n / (rows * rounds) for token, n in counts.items()}


def test_rows_are_drawn_in_proportion_to_their_probabilities() -> None:
    got = frequencies(_Sampler([request() for _ in range(4000)], torch.Generator().manual_seed(0)), 4000)
    assert set(got) == {0, 1, 2}  # never the token of probability 0
    for token, p in enumerate(PROBS[:3]):
        assert abs(got[token] - p) < 0.03, got


def test_top_p_keeps_the_smallest_set_that_reaches_it_and_renormalises() -> None:
    default = torch.Generator().manual_seed(1)
    assert set(frequencies(_Sampler([request(top_p=0.5) for _ in range(500)], default), 500)) == {0}
    got = frequencies(_Sampler([request(top_p=0.7) for _ in range(4000)], default), 4000)
    assert set(got) == {0, 1} and abs(got[0] - 0.5 / 0.8) < 0.03, got


def test_temperature_zero_rows_take_the_argmax_beside_sampled_rows() -> None:
    batch = [request(temperature=0.0), request(), request(temperature=0.0)] * 200
    picked = _Sampler(batch, torch.Generator().manual_seed(2)).pick(logits(len(batch))).tolist()
    assert set(picked[0::3]) == set(picked[2::3]) == {0}
    assert set(picked[1::3]) == {0, 1, 2}
    low = _Sampler([request(temperature=0.05)] * 300, torch.Generator().manual_seed(3))
    assert set(frequencies(low, 300)) == {0}  # sharpened: 0.5 against 0.3 becomes ~0.9999 to ~0


def test_a_seeded_rows_draws_do_not_depend_on_the_rows_beside_it() -> None:
    """SGLang's ``sampling_seed``: the same seed and logits give the same tokens whatever the batch."""

    def alone() -> list[int]:
        sampler = _Sampler([request(seed=7)], torch.Generator().manual_seed(0))
        return [int(sampler.pick(logits(1))[0]) for _ in range(40)]

    def beside_others() -> list[int]:
        sampler = _Sampler([request(), request(seed=7), request(seed=8)], torch.Generator().manual_seed(5))
        return [int(sampler.pick(logits(3))[1]) for _ in range(40)]

    assert alone() == beside_others() == alone()
    other = _Sampler([request(seed=8)], torch.Generator().manual_seed(0))
    assert [int(other.pick(logits(1))[0]) for _ in range(40)] != alone()
