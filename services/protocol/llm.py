"""The LLM proxy's contract with its callers (workers, load generators, trainers).

The proxy speaks SGLang's native HTTP API (``POST /generate``) and OpenAI's
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``); these names are what it adds.
"""

from __future__ import annotations

# request headers
HEADER_POOL = "X-Pool"  # which engine pool serves the call (/generate); OpenAI routes use ``model``
HEADER_SESSION = "X-Session-Id"  # affinity key: a trajectory id keeps its engine (prefix cache)
HEADER_DEADLINE = "X-Deadline-S"  # per-call budget in seconds; the proxy aborts the call after it
HEADER_JOB = "X-Rollout-Job"  # the job a service-token call is made for (attribution); job tokens imply it

# response headers (provenance: every answer says who produced it)
HEADER_ENGINE = "X-Engine-Id"
HEADER_WEIGHT_VERSION = "X-Weight-Version"
HEADER_RID = "X-Request-Id"  # the proxy-minted, collision-free request id

# body fields
BODY_SESSION = "session_id"  # alternative to the header, top-level in the JSON body
META_ENGINE = "engine_id"  # added to ``meta_info`` of /generate answers; weight_version is SGLang's own
