"""The dashboard's HTTP contract (``/ui/api/*`` of the rollout API), read by the page and by tests.

- ``GET /ui/api/overview`` -> :class:`Overview`: the jobs the caller may see (all of them for the
  admin token, its own job for a job token), the proxy's pools and engines, the broker's pools
- ``GET /ui/api/history?job=J`` -> :class:`History`: samples of the last hour (job and fleet)
- ``GET /ui/api/trajectories?job=J&...filters`` -> :class:`TrajectoryPage`
- ``GET /ui/api/trajectories/{job}/{entry_id}`` -> the trajectory as JSON plus its token texts
- ``GET /ui/api/trajectories.jsonl?job=J&...filters`` -> JSON lines, one trajectory each
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from services.protocol.api import JobStatus


class Staleness(BaseModel):
    """Weight versions behind the pool's current version, over the trainer's latest consumed trajectories."""

    pool_version: str | None  # what the job's pool serves now (proxy)
    sampled: int  # trajectories looked at (those up to the trainer group's last-delivered entry)
    mean: float | None = None
    max: int | None = None
    histogram: dict[str, int] = Field(default_factory=dict)  # staleness -> trajectories


class JobView(BaseModel):
    status: JobStatus  # exactly what ``GET /jobs/{job}`` answers
    weight_versions: dict[str, int] = Field(default_factory=dict)  # version -> turns, latest trajectories
    staleness: Staleness | None = None
    trainer_lag: int | None = None  # trajectories in the stream the trainer group has not read yet


class EngineView(BaseModel):
    engine_id: str
    pool: str
    state: str  # active | draining | quarantined
    ejected: bool
    in_flight: int
    load: int
    weight_version: str | None = None
    calls: int = 0  # finished calls (all proxy processes)
    errors: int = 0
    latency_p50_s: float | None = None


class PoolView(BaseModel):
    name: str
    version: str | None = None
    updating: bool = False
    engines: int = 0


class SandboxPoolView(BaseModel):
    pool: str
    ready: int
    target: int


class BrokerView(BaseModel):
    leases: int = 0
    lease_limit: int = 0
    admission_waiting: int = 0
    lease_p50_s: float | None = None  # request -> ready sandbox, over the broker's life
    lease_p99_s: float | None = None
    lease_p50_by_kind: dict[str, float] = Field(default_factory=dict)  # "backend/warm" -> p50 seconds
    pools: list[SandboxPoolView] = Field(default_factory=list)
    errors: dict[str, int] = Field(default_factory=dict)  # error code -> responses


class Overview(BaseModel):
    generated_at: float
    admin: bool
    jobs: list[JobView]
    pools: list[PoolView] = Field(default_factory=list)
    engines: list[EngineView] = Field(default_factory=list)
    broker: BrokerView | None = None
    problems: list[str] = Field(default_factory=list)  # sources that did not answer ("proxy: ...")


class JobSample(BaseModel):
    t: float
    queue_depth: int
    in_flight: int
    finished: int
    infra_errors: int
    episode_p50_s: float | None = None
    episode_p99_s: float | None = None


class FleetSample(BaseModel):
    t: float
    engines_in_flight: dict[str, int] = Field(default_factory=dict)
    sandboxes_ready: int = 0
    leases: int = 0
    admission_waiting: int = 0


class History(BaseModel):
    job: list[JobSample]
    fleet: list[FleetSample]


class TrajectoryRow(BaseModel):
    entry_id: str  # the trajectory stream's entry id (the detail route's key)
    trajectory_id: str
    attempt: int
    rollout_id: str
    task_id: str
    status: str
    truncation: str | None = None
    reward: float | None = None
    turns: int
    weight_versions: list[str]  # distinct, in order of first use
    infra_stage: str | None = None
    total_s: float
    finished_at: float


class TrajectoryPage(BaseModel):
    items: list[TrajectoryRow]
    next: str | None = None  # pass as ``before`` for the next (older) page
    scanned: int  # stream entries looked at for this page
