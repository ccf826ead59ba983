"""The demo's summary: a table of steps and evaluations, the JSON figures and the PNG plot.

Everything comes from the trainer's logs (``trainer/steps.jsonl``, ``trainer/evals.jsonl``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.runtime.tables import print_table
from trainer_client.evaluation import EvalRecord
from trainer_client.metrics import StepRecord
from trainer_client.plot import plot_steps

if TYPE_CHECKING:
    from services.fleet.run import UpOptions


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures(opts: UpOptions, steps: list[StepRecord], evals: list[EvalRecord], wall_s: float) -> dict[str, Any]:
    """The JSON summary: pass@1 before SFT, after it and after GRPO, plus what explains them."""

    def last(phase: str) -> EvalRecord | None:
        found = [e for e in evals if e.phase == phase]
        return found[-1] if found else None

    base, sft, rl = (last(phase) for phase in ("base", "sft", "grpo"))
    p_base, p_sft, p_rl = (None if e is None else e.pass_at_1 for e in (base, sft, rl))
    return {
        "pass_at_1_base": p_base, "pass_at_1_sft": p_sft, "pass_at_1_rl": p_rl,
        "improvement_rl_over_sft": None if p_rl is None or p_sft is None else p_rl - p_sft,
        # share of held-out episodes that ran a well-formed command and submitted (the rest: format errors)
        "submitted_sft": _submitted(sft), "submitted_rl": _submitted(rl),
        "heldout_tasks": evals[-1].tasks if evals else 0,
        "steps": len(steps), "sft_steps": opts.sft_steps, "wall_s": round(wall_s, 1), "seed": opts.seed,
        "teacher_accuracy": opts.teacher_accuracy, "train_tasks": opts.train_tasks,
        "group_size": opts.group_size, "batch_groups": opts.batch_groups, "lr": opts.lr,
        "model": {"hidden": opts.shape.hidden, "layers": opts.shape.layers, "heads": opts.shape.heads,
                  "kv_heads": opts.shape.kv_heads},
        "evaluations": [e.model_dump() for e in evals],
        "train_reward": [round(r.reward_mean, 4) for r in steps],
        "logprob_gap": [round(r.logprob_gap, 5) for r in steps],
        "ess": [round(r.ess, 4) for r in steps],
        "trajectories": sum(r.trajectories for r in steps),
        "load_average_at_end": list(os.getloadavg()),
    }  # fmt: skip


def report(opts: UpOptions, wall_s: float) -> dict[str, Any]:
    """Print the tables, write the plot and (when asked) the JSON; returns the figures."""
    trainer_dir = opts.work_dir / "trainer"
    steps = [StepRecord.model_validate(r) for r in read_jsonl(trainer_dir / "steps.jsonl")]
    evals = [EvalRecord.model_validate(r) for r in read_jsonl(trainer_dir / "evals.jsonl")]
    rows = [
        {"step": r.step, "reward": r.reward_mean, "trajectories": r.trajectories, "gen_tokens": r.generated_len_mean,
         "logprob_gap": r.logprob_gap, "ess": r.ess, "wait_s": r.timings.get("wait_rollouts_s"),
         "total_s": r.timings.get("total_s")}
        for r in steps
    ]  # fmt: skip
    print_table("GRPO steps (reward = share of episodes whose answer.txt was right)", rows)
    print_table("held-out evaluations", [
        {"phase": e.phase, "grpo_step": e.grpo_step, "version": e.version, "tasks": e.tasks,
         "pass@1": e.pass_at_1, "submitted": _submitted(e), "infra_errors": e.infra_errors, "seconds": e.seconds}
        for e in evals
    ])  # fmt: skip
    out = figures(opts, steps, evals, wall_s)
    print(f"\nheld-out pass@1: before SFT {_pct(out['pass_at_1_base'])}, after SFT {_pct(out['pass_at_1_sft'])}, "
          f"after {len(steps)} GRPO steps {_pct(out['pass_at_1_rl'])} ({out['heldout_tasks']} tasks, "
          f"{wall_s:.0f}s)")  # fmt: skip
    if steps:
        print(f"plot: {plot_steps(steps, opts.work_dir / 'demo.png', evals)}")
    if opts.json_path:
        opts.json_path.parent.mkdir(parents=True, exist_ok=True)
        opts.json_path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"summary: {opts.json_path}")
    return out


def _submitted(record: EvalRecord | None) -> float | None:
    if record is None or not record.trajectories:
        return None
    return round(record.by_status.get("completed", 0) / record.trajectories, 4)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
