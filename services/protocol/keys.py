"""Every Redis key and stream name of the platform, built in one place.

Per-job keys carry the job in a hash tag (``{job}``) so that all of a job's keys live in one
Redis Cluster slot (multi-key commands and transactions on them stay legal). Fleet-wide keys
(proxy membership, broker leases) are tagged by their own owner the same way.
"""

from __future__ import annotations

PREFIX = "rollout"

# consumer group names
WORKERS_GROUP = "workers"  # on every work stream: the rollout workers
TRAINERS_GROUP = "trainer"  # on every trajectory stream: the job's trainer (acks after its checkpoint)


def _job(job: str) -> str:
    return f"{PREFIX}:job:{{{job}}}"


# -- jobs (rollout API, workers, trainers) ---------------------------------------------------


def jobs_index() -> str:
    """Set of all job names."""
    return f"{PREFIX}:jobs"


def job_record(job: str) -> str:
    """Hash: the job's settings (pool, weight, quotas, token hash)."""
    return f"{_job(job)}:meta"


def work_stream(job: str) -> str:
    """Stream of :class:`~services.protocol.tasks.WorkItem` entries for the job."""
    return f"{_job(job)}:work"


def dead_letters(job: str) -> str:
    """Stream of work entries no worker could decode: the original fields, the reason, the entry id."""
    return f"{_job(job)}:dead"


def trajectory_stream(job: str) -> str:
    """Stream of finished trajectories for the job (see ``trajectory.to_stream_fields``)."""
    return f"{_job(job)}:traj"


def eval_stream(job: str) -> str:
    """Stream of the job's evaluation trajectories (rollouts with ``mode="eval"``): no trainer reads it."""
    return f"{_job(job)}:traj:eval"


def rollout_stream(job: str, mode: str) -> str:
    """Where a rollout of ``mode`` publishes its trajectories."""
    return eval_stream(job) if mode == "eval" else trajectory_stream(job)


def rollout_results(job: str, rollout_id: str) -> str:
    """Hash (evaluation rollouts): trajectory id -> its ``SampleResult`` JSON (pass@k)."""
    return f"{_job(job)}:rollout:{rollout_id}:results"


def rollout_record(job: str, rollout_id: str) -> str:
    """Hash: one rollout's request summary and counters."""
    return f"{_job(job)}:rollout:{rollout_id}"


def rollout_tasks(job: str, rollout_id: str) -> str:
    """Hash: task id -> :class:`~services.protocol.tasks.Task` JSON, once per rollout (work items name it)."""
    return f"{_job(job)}:rollout:{rollout_id}:tasks"


def rollout_index(job: str) -> str:
    """Sorted set of the job's rollout ids by submission time."""
    return f"{_job(job)}:rollouts"


def idempotency(job: str, key: str) -> str:
    """String: the rollout id created for an idempotency key."""
    return f"{_job(job)}:idem:{key}"


def published(job: str) -> str:
    """Set of ``trajectory_id#attempt`` already published (idempotent publishing)."""
    return f"{_job(job)}:published"


def job_stats(job: str) -> str:
    """Hash of the job's counters: fields in ``services.protocol.counters``."""
    return f"{_job(job)}:stats"


def job_tokens() -> str:
    """Hash: sha256 of a job token -> job name (the rollout API resolves bearer tokens with it)."""
    return f"{PREFIX}:jobs:tokens"


def lease_token(token_sha256: str) -> str:
    """String: the one lease a lease token may act on (exec and files only), keyed by the token's
    sha256; written by the worker for a ``command`` agent, read by the broker, gone with the episode."""
    return f"{PREFIX}:leasetoken:{{{token_sha256}}}"


def attempts(job: str) -> str:
    """Hash: trajectory id -> attempts started so far (workers; survives a worker crash)."""
    return f"{_job(job)}:attempts"


def finished(job: str) -> str:
    """Hash: trajectory id -> the attempt whose record was published (at most one per trajectory)."""
    return f"{_job(job)}:finished"


def job_recent(job: str) -> str:
    """List of the job's latest finished episodes, ``"<finished_at> <seconds> <turn_cap 0|1>"``, newest first."""
    return f"{_job(job)}:recent"


def rollout_episodes(job: str, rollout_id: str) -> str:
    """List of one rollout's episode durations in seconds (tail figures)."""
    return f"{_job(job)}:rollout:{rollout_id}:episodes"


# -- LLM proxy -------------------------------------------------------------------------------


def proxy_state() -> str:
    """Hash: fleet membership and per-pool state shared by all proxy processes."""
    return f"{PREFIX}:proxy:{{fleet}}:state"


def proxy_events() -> str:
    """Pub/sub channel telling proxy processes that shared state changed."""
    return f"{PREFIX}:proxy:{{fleet}}:events"


def proxy_weight_lock(pool: str) -> str:
    """String lock: one weight-update transaction per pool at a time."""
    return f"{PREFIX}:proxy:{{fleet}}:lock:{pool}"


# -- agent gateway (one hash tag per session: its keys share a slot) --------------------------


def gateway_session(session: str) -> str:
    """String: the ``GatewaySession`` JSON, written by the worker; expires with the episode."""
    return f"{PREFIX}:gw:{{{session}}}:session"


def gateway_calls(session: str) -> str:
    """List of msgpack ``GatewayCall`` records, one per LLM call, in call order."""
    return f"{PREFIX}:gw:{{{session}}}:calls"


def gateway_state(session: str) -> str:
    """String: the msgpack ``SessionState`` (counters, caps hit) of the session."""
    return f"{PREFIX}:gw:{{{session}}}:state"


def gateway_context(session: str) -> str:
    """String: the last call's normalised messages and reply (JSON), for token-in merging."""
    return f"{PREFIX}:gw:{{{session}}}:context"


# -- sandbox broker --------------------------------------------------------------------------


def lease(lease_id: str) -> str:
    """Hash: one sandbox lease; expires with its TTL unless renewed."""
    return f"{PREFIX}:broker:{{leases}}:lease:{lease_id}"


def leases_index() -> str:
    """Sorted set of lease ids by expiry time (reaping)."""
    return f"{PREFIX}:broker:{{leases}}:index"


def job_leases(job: str) -> str:
    """Set of the job's lease ids (per-job quotas, ``GET /leases?job=``)."""
    return f"{PREFIX}:broker:{{leases}}:job:{job}"


def backend_leases(backend: str) -> str:
    """Set of the lease ids held on one backend (per-backend concurrency)."""
    return f"{PREFIX}:broker:{{leases}}:backend:{backend}"


def leases_ended() -> str:
    """Pub/sub channel: the id of every lease that ends (claimed for release or reaping), so that
    each broker replica drops its cached copy of the record."""
    return f"{PREFIX}:broker:{{leases}}:ended"


def broker_instance(instance: str) -> str:
    """String with a short TTL: the broker replica is alive (its pool sandboxes are its own)."""
    return f"{PREFIX}:broker:{{leases}}:instance:{instance}"


def pool_offers(label: str, instance: str) -> str:
    """List: the warm sandboxes of one pool that one broker replica offers to workers, each claimed
    straight from Redis (``protocol/warm_offers.py``)."""
    return f"{PREFIX}:broker:{{leases}}:offers:{label}:{instance}"


def pool_offerers(label: str) -> str:
    """Set: the broker replicas with an offer list for the pool ``label``."""
    return f"{PREFIX}:broker:{{leases}}:offerers:{label}"


def offer_lists(instance: str) -> str:
    """Set: the pools a broker replica has offered sandboxes of (its lists dropped when it starts again)."""
    return f"{PREFIX}:broker:{{leases}}:offer-lists:{instance}"


def broker_waiting(instance: str) -> str:
    """String with a short TTL: lease requests wait in the replica's admission queue (they come before
    a worker's claim of its warm sandboxes)."""
    return f"{PREFIX}:broker:{{leases}}:waiting:{instance}"


def sandbox_reap_lock(sandbox_id: str) -> str:
    """String lock: one replica removes an orphaned sandbox."""
    return f"{PREFIX}:broker:{{leases}}:reap:{sandbox_id}"


def broker_templates() -> str:
    """Hash: template name -> ``Template`` JSON registered with the broker."""
    return f"{PREFIX}:broker:{{leases}}:templates"


# -- dashboard (rollout API) -----------------------------------------------------------------


def dashboard_job_samples(job: str) -> str:
    """List of the job's dashboard samples (``JobSample`` JSON), newest first, trimmed to an hour."""
    return f"{_job(job)}:dash:samples"


def dashboard_fleet_samples() -> str:
    """List of fleet-wide dashboard samples (``FleetSample`` JSON), newest first."""
    return f"{PREFIX}:dash:{{fleet}}:samples"


def dashboard_sample_lock() -> str:
    """String lock with a short TTL: one API replica takes each round of samples."""
    return f"{PREFIX}:dash:{{fleet}}:lock"


# -- the store itself -----------------------------------------------------------------------


def store_generation() -> str:
    """String: a random id set once by the first service to find it missing. A Redis that restarts
    empty loses it, which is how every service tells a store that lost its state from an outage."""
    return f"{PREFIX}:{{store}}:generation"
