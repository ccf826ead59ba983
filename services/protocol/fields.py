"""The field types and bounds of the wire contract: names, process-bound strings, numeric limits and
defaults. A module of its own (no models) so that a process that needs a bound or a name type does
not build the task models (``tasks.py`` re-uses every one of them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import StringConstraints

# Job, pool, task and template names end up inside Redis keys and URLs: keep them tame.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")]

DEFAULT_POOL = "default"  # the proxy pool of a job that names none, and of engines seeded without one

# Reaches a process (argv, shell, env value, path): no NUL byte, which no exec or open() can carry.
Text = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]
EnvKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")]
FilePath = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=r"^[^\x00]*[^\x00/]$")]
SourceVersion = Annotated[str, StringConstraints(max_length=200, pattern=r"^[^\x00\n]*$")]

MIN_CPUS = 0.01  # the smallest CPU share every backend accepts (a cgroup's cpu.max quota of 1 ms per 100 ms)
MIN_INT, MAX_INT = -(2**63), 2**64 - 1  # the integers the trajectory codec (msgpack) carries
MAX_DEPTH = 32  # nesting of metadata values

MAX_MEMORY_MB = 1_048_576  # 1 TiB
MAX_DISK_MB = 1_048_576
MAX_TIMEOUT_S = 86_400.0  # one day, for any single timeout or TTL
MAX_TOKENS = 4_194_304  # per turn or per trajectory

DEFAULT_MAX_TURNS = 80
DEFAULT_MAX_TOKENS_PER_TURN = 8_192
DEFAULT_MAX_TRAJECTORY_TOKENS = 65_536
DEFAULT_CONTEXT_LENGTH = 65_536
DEFAULT_GROUP_SIZE = 8

# how a sandbox is kept from its host: "namespaces" (local: bubblewrap; docker: runc), "gvisor" (local:
# runsc; docker: the runsc runtime). Left out: the template's, else the backend's own (``/healthz``
# ``isolation.isolation_levels`` lists what a broker can give)
Isolation = Literal["namespaces", "gvisor"]
