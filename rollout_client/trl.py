"""TRL's ``GRPOTrainer`` training through the platform: ``rollout_func`` and a weight-sync callback.

TRL 1.16 (``trl/trainer/grpo_trainer.py``, the ``rollout_func`` docstring) calls
``rollout_func(prompts, trainer)`` with the process's slice of the generation batch, each prompt
repeated ``num_generations`` times in a row, and expects one completion per entry: a dict with
``prompt_ids``, ``completion_ids`` and ``logprobs`` (lists of per-sample lists), optionally
``env_mask`` (1 on tokens the model generated, 0 on the environment's), every other key forwarded
to the reward functions as a per-sample column.

:class:`PlatformRollout` turns each run of identical prompts into one platform task with that run's
length as its group size (``make_task`` builds the task from the prompt: its sandbox, reward
command, agent), submits them, reads the finished trajectories back over the API's trajectory stream
and returns them token-exact: ``prompt_ids`` is the trajectory's, ``completion_ids`` its
``response_ids`` (every turn's generated tokens and the observations between them), ``logprobs`` the
engine's, ``env_mask`` its ``loss_mask``. Extra columns: ``reward`` (the platform's, read by
:func:`platform_reward`), ``status``, ``trajectory_id`` and ``weight_versions`` (the version that
served each turn).

Infrastructure failures never reach the loss. The platform retries them first (``max_attempts``);
a sample still ``infra_error`` is run again here as a new one-sample rollout of its task, up to
``reruns`` times; one that still fails is kept in its place (TRL needs every position) as a masked
placeholder: ``env_mask`` all 0 (none of its tokens is in the loss) and ``reward`` None, which
TRL 1.16 treats as unscorable: left out of its group's mean and std, its advantage forced to 0. A
group left with no scorable member therefore gives no gradient at all (the whole group is, in effect,
dropped). ``cancelled`` samples are handled the same way.

:class:`WeightSyncCallback` exports the policy after every optimizer step (``save_pretrained``, the
tokenizer, ``CHECKSUM``) and posts it through the proxy's weight-update transaction, so the next
rollout is served by what TRL just trained (the version is ``version_label(step, epoch)``).

A trajectory with several segments (an agent served by the gateway that rewrote its history) is not
one token sequence and has no TRL equivalent: it raises ``ValueError`` rather than being cut.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rollout_client.http import RolloutClient
from rollout_client.weights import SyncOutcome, WeightPublisher, seal
from services.protocol.agents import AgentSpec, BashAgent
from services.protocol.status import Status
from services.protocol.tasks import AgentLimits, RolloutRequest, SamplingParams, Task
from services.protocol.trajectory import Trajectory
from services.protocol.weights import version_label

logger = logging.getLogger(__name__)

TaskMaker = Callable[[str], Task]


def prompt_text(prompt: Any) -> str:
    """A TRL prompt as the task's text: a string as is; a conversation's last user message."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        content = prompt[-1].get("content", "")
        if isinstance(content, list):  # typed content blocks: the text ones
            return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        return str(content)
    raise TypeError(f"unsupported prompt {type(prompt).__name__}")


def runs(prompts: list[Any]) -> list[tuple[int, int]]:
    """``(start, length)`` of each run of identical consecutive prompts (TRL repeats each one
    ``num_generations`` times in a row): one platform task and GRPO group per run."""
    out: list[tuple[int, int]] = []
    for i, prompt in enumerate(prompts):
        if out and prompts[out[-1][0]] == prompt:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


@dataclass
class Sample:
    """One TRL position and what the platform produced for it (None: not yet, or placeholder)."""

    row: int
    task: Task
    trajectory: Trajectory | None = None
    reruns: int = 0


def platform_reward(completions: list[Any], reward: list[float | None], **_: Any) -> list[float | None]:
    """TRL reward function: the platform's reward column (None for an infra-failed placeholder)."""
    return list(reward)


@dataclass
class PlatformRollout:
    """TRL's ``rollout_func``: see the module docstring."""

    client: RolloutClient
    job: str
    make_task: TaskMaker
    limits: AgentLimits = field(default_factory=AgentLimits)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    agent: AgentSpec = field(default_factory=BashAgent)
    max_attempts: int = 3  # the platform's own infra retries per sample
    reruns: int = 1  # further runs here of a sample that still ended infra_error
    timeout_s: float = 3600.0
    pad_token_id: int = 0  # the placeholder's one token (masked out)
    cursor: str | None = None  # the last stream entry read; the next call reads after it
    calls: int = 0
    wait_s: float = 0.0  # time spent waiting on the platform, over every call
    last: list[Sample] = field(default_factory=list)  # the last call's samples, for inspection

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        start = time.perf_counter()
        self.calls += 1
        samples: list[Sample] = []
        for run_index, (first, length) in enumerate(runs(prompts)):
            task = self.make_task(prompt_text(prompts[first])).model_copy(update={"id": f"p{run_index}"})
            samples += [Sample(first + i, task) for i in range(length)]
        self._run(samples, rerun=False)
        for _ in range(self.reruns):
            failed = [s for s in samples if s.trajectory is None or s.trajectory.status is Status.INFRA_ERROR]
            if not failed:
                break
            for s in failed:
                s.reruns += 1
            self._run(failed, rerun=True)
        self.last = samples
        self.wait_s += time.perf_counter() - start
        return self._output(samples)

    def _run(self, samples: list[Sample], rerun: bool) -> None:
        """Submit the samples (a group per task, or one rollout per sample on a rerun) and wait for each record."""
        if rerun:
            groups = [[s] for s in samples]
        else:
            by_task: dict[str, list[Sample]] = {}
            for s in samples:
                by_task.setdefault(s.task.id, []).append(s)
            groups = list(by_task.values())
        by_size: dict[int, list[list[Sample]]] = {}
        for group in groups:  # one request per group size (a request has one)
            by_size.setdefault(len(group), []).append(group)
        slots: dict[tuple[str, str, int], Sample] = {}  # (rollout, task id, sample index) -> its TRL position
        for size, same in by_size.items():
            request = RolloutRequest(
                job=self.job, tasks=[g[0].task.model_copy(update={"id": f"p{i}"}) for i, g in enumerate(same)],
                group_size=size, limits=self.limits, sampling=self.sampling, agent=self.agent,
                max_attempts=self.max_attempts,
            )  # fmt: skip
            rollout_id = self.client.submit(request).rollout_id
            for i, group in enumerate(same):
                for j, sample in enumerate(group):
                    slots[(rollout_id, f"p{i}", j)] = sample
        self._collect(slots)

    def _collect(self, slots: dict[tuple[str, str, int], Sample]) -> None:
        """Read the job's stream after the cursor until every submitted sample has its record."""
        deadline = time.monotonic() + self.timeout_s
        while slots:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(slots)} samples did not finish within {self.timeout_s} s")
            remaining = max(0.0, deadline - time.monotonic())
            for event in self.client.trajectories(self.job, after=self.cursor, idle_timeout_s=remaining):
                self.cursor = event.entry_id
                traj = event.trajectory
                found = slots.pop((traj.rollout_id, traj.task_id, traj.sample_index), None)
                if found is not None:
                    found.trajectory = traj
                if not slots:
                    break

    def _output(self, samples: list[Sample]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "reward",
                                                      "status", "trajectory_id", "weight_versions")}  # fmt: skip
        for s in sorted(samples, key=lambda s: s.row):
            traj = s.trajectory
            if traj is not None and traj.segments:
                raise ValueError(f"{traj.trajectory_id} has {1 + len(traj.segments)} segments: not one TRL sample")
            usable = traj is not None and traj.status.trainable and len(traj.response_ids) > 0
            if usable and traj is not None:
                out["prompt_ids"].append(traj.prompt_ids.tolist())
                out["completion_ids"].append(traj.response_ids.tolist())
                out["logprobs"].append([float(x) for x in traj.response_logprobs])
                out["env_mask"].append(traj.loss_mask.tolist())
                out["reward"].append(traj.reward)
            else:  # the masked placeholder: no token in the loss, no reward (TRL: unscorable, advantage 0)
                prompt = traj.prompt_ids.tolist() if traj is not None and len(traj.prompt_ids) else [self.pad_token_id]
                out["prompt_ids"].append(prompt)
                out["completion_ids"].append([self.pad_token_id])
                out["logprobs"].append([0.0])
                out["env_mask"].append([0])
                out["reward"].append(None)
            out["status"].append(traj.status.value if traj is not None else Status.INFRA_ERROR.value)
            out["trajectory_id"].append(traj.trajectory_id if traj is not None else "")
            out["weight_versions"].append(traj.weight_versions if traj is not None else [])
        return out


def rollout_func(api_url: str, token: str, job: str, make_task: TaskMaker, **options: Any) -> PlatformRollout:
    """``GRPOTrainer(rollout_func=rollout_func(API_URL, TOKEN, JOB, make_task))``; ``options`` are
    :class:`PlatformRollout`'s (``limits``, ``sampling``, ``agent``, ``max_attempts``, ``reruns``)."""
    return PlatformRollout(RolloutClient(api_url, token), job, make_task, **options)


class WeightSyncCallback(TrainerCallback):
    """After each optimizer step: export the policy and post it through the proxy's weight transaction."""

    def __init__(
        self, proxy_url: str, token: str | None, pool: str, export_root: Path, epoch: int = 1, keep: int = 2
    ) -> None:
        self.publisher = WeightPublisher(proxy_url, pool, token=token)
        self.export_root = export_root
        self.epoch = epoch
        self.keep = keep
        self.outcomes: list[tuple[str, SyncOutcome]] = []  # (version, the fleet's verdict) per step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        version = version_label(int(state.global_step), self.epoch)
        target = self.export_root / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        kwargs["model"].save_pretrained(target, safe_serialization=True)
        tokenizer = kwargs.get("processing_class")
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(target)
        outcome = self.publisher.publish(seal(target, version))
        self.outcomes.append((version, outcome))
        if not outcome.ok:
            raise RuntimeError(f"weight update {version} failed: {outcome.error or outcome.result}")
        for old in sorted(self.export_root.glob("v*"), key=lambda p: p.stat().st_mtime)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.publisher.close()
