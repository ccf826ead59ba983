"""Warm sandboxes claimed straight from Redis: the contract between a broker replica that offers
its pooled sandboxes and a worker that claims them with one script call, no broker request.

A broker replica keeps one list per warm pool (``keys.pool_offers(label, instance)``) holding an
*offer* per ready sandbox, and names itself in the pool's set of offerers. A worker's claim
(:data:`CLAIM`) pops offers and, in the same script, admits and records each lease exactly as the
broker's own ``POST /leases`` warm path does (``sandbox_broker/leases.py``: the same index, job
and backend sets, the same record fields and TTL, the owner's limits), so a claimed lease is
renewed, exec'd, released and reaped through the broker like any other. The broker withdraws an
offer (``LREM``) before it hands the sandbox out itself or destroys it, so a sandbox goes to one
lease only; it notices claims by the shrinking of its list and refills the pool.

A replica's offers are skipped while its ``broker_instance`` key is gone (it stopped or lost
Redis: its sandboxes become orphans) and while requests wait in its admission queue
(``broker_waiting``: they come first, as on its own warm path). A claim stops at the first full
limit and leaves the rest of the batch to the broker (``POST /leases/batch``, then its queue).

An offer is text, newline-separated: max global leases, max leases on the backend, max per job,
record grace in ms, sandbox id, backend, then the tail of the Lease JSON (the sandbox's fields and
the closing brace). A claim sends the head of each Lease JSON (its id, job, expiry, labels, ...)
and the script joins the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from services.protocol import keys
from services.protocol.sandboxes import Lease, LeaseRequest, Resources

# KEYS: leases index, job set, offerers set, then the record of each lease. ARGV: job, offer list
# prefix, instance key prefix, backend set prefix, waiting key prefix, then per lease its id, Lease
# JSON head, expires_at and record ttl ms. Returns the Lease JSON of each lease claimed, in order
# (fewer than asked: no offer left, or a limit full). The offers are popped in one RPOP and the index
# and sets written once per claim (ZADD, SADD of all its ids; those not taken pushed back in their
# order): per lease only its record's HSET and PEXPIRE, about 12 us of Redis a lease instead of 15-20
# with a pop and three adds each.
CLAIM = """
local owners = redis.call('SMEMBERS', KEYS[3])
local out = {}
local wanted = #KEYS - 3
local held = redis.call('ZCARD', KEYS[1])
local of_job = redis.call('SCARD', KEYS[2])
local on_backend = {}
local scored, ids, by_backend = {}, {}, {}
local function add_all(command, key, args)
  for first = 1, #args, 1000 do
    redis.call(command, key, unpack(args, first, math.min(first + 999, #args)))
  end
end
local function finish()
  if #ids > 0 then
    add_all('ZADD', KEYS[1], scored)
    add_all('SADD', KEYS[2], ids)
    for bset, members in pairs(by_backend) do add_all('SADD', bset, members) end
  end
  return out
end
for _, owner in ipairs(owners) do
  if #out == wanted then break end
  if redis.call('EXISTS', ARGV[3] .. owner) == 0 then
    redis.call('SREM', KEYS[3], owner)
  elseif redis.call('EXISTS', ARGV[5] .. owner) == 0 then
    local list = ARGV[2] .. owner
    local offers = redis.call('RPOP', list, wanted - #out)
    for k, offer in ipairs(offers or {}) do
      local g, b, j, grace, sid, backend, tail = string.match(offer,
        '^(%d+)\\n(%d+)\\n(%d+)\\n(%d+)\\n([^\\n]*)\\n([^\\n]*)\\n(.*)$')
      local bset = ARGV[4] .. backend
      if not on_backend[backend] then on_backend[backend] = redis.call('SCARD', bset) end
      if held >= tonumber(g) or on_backend[backend] >= tonumber(b) or of_job >= tonumber(j) then
        for back = #offers, k, -1 do redis.call('RPUSH', list, offers[back]) end
        return finish()
      end
      local i = #out + 1
      local at = 5 + (i - 1) * 4
      local id, doc = ARGV[at + 1], ARGV[at + 2] .. tail
      local record = KEYS[3 + i]
      scored[#scored + 1] = ARGV[at + 3]
      scored[#scored + 1] = id
      ids[i] = id
      if not by_backend[bset] then by_backend[bset] = {} end
      table.insert(by_backend[bset], id)
      redis.call('HSET', record, 'job', ARGV[1], 'backend', backend, 'owner', owner, 'state', 'live',
                 'lease', doc, 'sandbox_id', sid, 'network', 'none')
      redis.call('PEXPIRE', record, tonumber(ARGV[at + 4]) + tonumber(grace))
      held, of_job, on_backend[backend] = held + 1, of_job + 1, on_backend[backend] + 1
      out[i] = doc
    end
  end
end
return finish()
"""


def pool_label(template: str, resources: Resources, network: str = "none") -> str:
    """The name of the warm pool of ``template`` at ``resources`` (metrics, offer keys)."""
    return f"{template}/{resources.cpus:g}cpu/{resources.memory_mb}mb/{resources.disk_mb}mb/{network}"


def claimable(request: LeaseRequest) -> bool:
    """A request a warm sandbox on offer can serve: no setup, no network, the template's isolation."""
    return request.setup is None and request.network == "none" and request.isolation is None


@dataclass(frozen=True, slots=True)
class Offer:
    """A ready pooled sandbox, as its broker replica offers it."""

    limits: tuple[int, int, int]  # the owner's max leases: global, on its backend, per job
    grace_ms: int  # how long a record outlives its lease's expiry (the owner's ``ttl_grace_s``)
    sandbox_id: str
    backend: str
    template: str
    workdir: str

    def encode(self) -> str:
        tail = orjson.dumps({"template": self.template, "backend": self.backend, "sandbox_id": self.sandbox_id,
                             "workdir": self.workdir, "warm": True}).decode()[1:]  # fmt: skip
        fields = [*self.limits, self.grace_ms, self.sandbox_id, self.backend, tail]
        return "\n".join(str(field) for field in fields)


def lease_head(lease_id: str, request: LeaseRequest, expires_at: float, start_s: float) -> bytes:
    """The Lease JSON of a claim up to the offer's tail (the fields the claimer knows)."""
    head = {"id": lease_id, "job": request.job, "expires_at": expires_at, "start_s": start_s,
            "labels": request.labels, "setup_s": 0.0, "setup_shared": False}  # fmt: skip
    return orjson.dumps(head)[:-1] + b","


def claim_keys(request: LeaseRequest, lease_ids: list[str]) -> list[str]:
    label = pool_label(request.template, request.resources)
    return [keys.leases_index(), keys.job_leases(request.job), keys.pool_offerers(label),
            *(keys.lease(i) for i in lease_ids)]  # fmt: skip


def claim_prefixes(request: LeaseRequest) -> list[str]:
    """ARGV 1-5 of :data:`CLAIM` for ``request``'s pool and job."""
    label = pool_label(request.template, request.resources)
    return [request.job, keys.pool_offers(label, ""), keys.broker_instance(""), keys.backend_leases(""),
            keys.broker_waiting("")]  # fmt: skip


def claimed(docs: list[bytes]) -> list[Lease]:
    return [Lease.model_validate_json(doc) for doc in docs]
