"""The final figure of a run: reward, lengths, logprob gap, ESS and the step-time breakdown."""

from __future__ import annotations

from pathlib import Path

from trainer_client.metrics import PHASES, StepRecord


def plot_steps(records: list[StepRecord], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in records]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    series = [
        ("reward mean", [r.reward_mean for r in records]),
        ("generated tokens / trajectory", [r.generated_len_mean for r in records]),
        ("|trainer - engine| logprob / token", [r.logprob_gap for r in records]),
        ("importance-weight ESS", [r.ess for r in records]),
        ("grad norm", [r.grad_norm for r in records]),
    ]
    for ax, (title, values) in zip(axes.flat, series, strict=False):
        ax.plot(steps, values, marker="o")
        ax.set_title(title)
        ax.set_xlabel("step")
    ax = axes.flat[5]
    bottom = [0.0] * len(records)
    for phase in PHASES:
        values = [r.timings.get(phase, 0.0) for r in records]
        ax.bar(steps, values, bottom=bottom, label=phase.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_title("step time breakdown (s)")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
