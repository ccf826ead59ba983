"""The final figure of a run: held-out pass@1, reward, lengths, logprob gap, ESS and the step-time breakdown."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer_client.evaluation import EvalRecord
from trainer_client.metrics import PHASES, StepRecord


def plot_steps(records: list[StepRecord], path: Path, evals: Sequence[EvalRecord] = ()) -> Path:
    """One panel per figure; with ``evals``, held-out pass@1 by GRPO step comes first (SFT at 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in records]
    fig, axes = plt.subplots(2, 4 if evals else 3, figsize=(20 if evals else 15, 8))
    panels = list(axes.flat)
    if evals:
        _plot_evals(panels.pop(0), evals)
    series = [
        ("train reward mean", [r.reward_mean for r in records]),
        ("generated tokens / trajectory", [r.generated_len_mean for r in records]),
        ("|trainer - engine| logprob / token", [r.logprob_gap for r in records]),
        ("importance-weight ESS", [r.ess for r in records]),
        ("grad norm", [r.grad_norm for r in records]),
    ]
    for ax, (title, values) in zip(panels, series, strict=False):
        ax.plot(steps, values, marker="o")
        ax.set_title(title)
        ax.set_xlabel("step")
    _plot_timings(panels[len(series)], records)
    for ax in panels[len(series) + 1 :]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_evals(ax: Any, evals: Sequence[EvalRecord]) -> None:
    grpo = [e for e in evals if e.phase != "base"]
    ax.plot([e.grpo_step for e in grpo], [e.pass_at_1 for e in grpo], marker="o", label="after SFT / GRPO")
    for e in evals:
        if e.phase == "base":
            ax.axhline(e.pass_at_1, color="grey", linestyle="--", label="before SFT")
    ax.set_ylim(0, 1)
    ax.set_title(f"held-out pass@1 ({evals[0].tasks} tasks)")
    ax.set_xlabel("GRPO step (0 = after SFT)")
    ax.legend(fontsize=8)


def _plot_timings(ax: Any, records: list[StepRecord]) -> None:
    steps = [r.step for r in records]
    bottom = [0.0] * len(records)
    for phase in PHASES:
        values = [r.timings.get(phase, 0.0) for r in records]
        ax.bar(steps, values, bottom=bottom, label=phase.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_title("step time breakdown (s)")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
