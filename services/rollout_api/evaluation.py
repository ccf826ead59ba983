"""``GET /rollouts/{id}/eval``: pass@k of an evaluation rollout from its samples' results.

Workers write one ``SampleResult`` per finished sample into the rollout's results hash (in the
same script that publishes it to the eval stream), so a report costs one HGETALL, whatever the
length of the stream.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis

from services.protocol import ErrorCode, PlatformError, Status, keys
from services.protocol.api import EvalReport, EvalTaskResult, SampleResult
from services.protocol.tasks import EvalOptions
from services.rollout_api.records import decode_hash, int_field


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Unbiased pass@k of one task with ``n`` samples of which ``c`` passed (Chen et al. 2021):
    ``1 - C(n-c, k) / C(n, k)``, as a product that stays exact for large n; None when n < k."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and k >= 1 (n={n}, c={c}, k={k})")
    if n < k:
        return None
    if n - c < k:
        return 1.0
    missed = 1.0
    for i in range(n - c + 1, n + 1):
        missed *= 1.0 - k / i
    return 1.0 - missed


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def task_result(
    task_id: str, group_size: int, samples: list[SampleResult], ks: list[int], threshold: float
) -> EvalTaskResult:
    rewards: list[float | None] = [None] * group_size
    for sample in samples:
        if 0 <= sample.sample_index < group_size:
            rewards[sample.sample_index] = sample.reward
    scored = [r for r in rewards if r is not None]
    passed = sum(1 for r in scored if r >= threshold)
    pass_at = {str(k): pass_at_k(len(scored), passed, k) for k in ks}
    return EvalTaskResult(task_id=task_id, rewards=rewards, samples=len(scored), passed=passed, pass_at=pass_at)


def build_report(
    rollout_id: str, job: str, values: dict[str, str], samples: list[SampleResult], task_ids: list[str]
) -> EvalReport:
    """The report of one rollout: ``values`` is its record, ``task_ids`` its tasks."""
    options = EvalOptions.model_validate_json(values.get("eval") or "{}")
    ks = sorted({1, *options.k})
    group_size = int_field(values, "group_size")
    by_task: dict[str, list[SampleResult]] = {task: [] for task in task_ids}
    for sample in samples:
        by_task.setdefault(sample.task_id, []).append(sample)
    tasks = [task_result(t, group_size, by_task[t], ks, options.threshold) for t in sorted(by_task)]
    pass_at = {str(k): _mean(t.pass_at[str(k)] for t in tasks) for k in ks}
    versions: Counter[str] = Counter(v for s in samples for v in s.weight_versions)
    statuses = Counter(s.status for s in samples)
    return EvalReport(
        rollout_id=rollout_id,
        job=job,
        complete=int_field(values, "done") >= int_field(values, "total"),
        total=int_field(values, "total"),
        finished=len(samples),
        seed=options.seed,
        threshold=options.threshold,
        pass_at_1=pass_at["1"],
        pass_at=pass_at,
        tasks_scored={str(k): sum(1 for t in tasks if t.samples >= k) for k in ks},
        mean_reward=_mean(s.reward for s in samples),
        by_status={s.value: statuses.get(s.value, 0) for s in Status},
        weight_versions=dict(versions),
        tasks=tasks,
    )


async def eval_report(redis: Redis, job: str, rollout_id: str) -> EvalReport | None:
    """None when there is no such rollout; 409 when it is not an evaluation."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.rollout_record(job, rollout_id))
        pipe.hvals(keys.rollout_results(job, rollout_id))
        pipe.hkeys(keys.rollout_tasks(job, rollout_id))
        raw, results, task_ids = await pipe.execute()
    if not raw:
        return None
    values = decode_hash(raw)
    if values.get("mode") != "eval":
        mode = values.get("mode") or "train"
        raise PlatformError(ErrorCode.CONFLICT, f"rollout {rollout_id!r} is not an evaluation (mode {mode!r})")
    samples = [SampleResult.model_validate_json(r) for r in results]
    return build_report(rollout_id, job, values, samples, sorted(_text(t) for t in task_ids))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
