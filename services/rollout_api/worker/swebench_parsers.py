"""The official ``swebench`` package's log parsers (``swebench.harness.log_parsers``) as the
reference for ``tests.log_parser: "swebench"``: the per-test statuses of a run that pytest's report
plugin did not record (a unittest or Django runner, sympy's ``bin/test``, a pytest that never
started) come from the parser the instance names (``swebench_parser``: a name in the package's
``PARSER_REGISTRY``, e.g. ``parse_log_django``; SWE-bench 5.x rows carry it as ``log_parser``).

Optional (``pip install '.[swebench]'``: the package pulls in modal, GitPython and more): the worker
imports it on first use only. Without it, or for a name it does not know, scoring is an infra error
(the task asked for a reference the deployment lacks), never a guess.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

Parser = Callable[[str, Any], dict[str, str]]
STATUSES = frozenset({"PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"})  # swebench's TestStatus values


class Unavailable(LookupError):
    """The package is not installed, or has no parser of that name."""


@functools.cache
def _registry() -> dict[str, Parser]:
    try:
        module = importlib.import_module("swebench.harness.log_parsers")
    except ImportError as exc:
        raise Unavailable(f"the swebench package is not installed (pip install '.[swebench]'): {exc}") from exc
    return dict(module.PARSER_REGISTRY)


def parse(log: str, parser: str, instance_id: str = "", repo: str = "") -> dict[str, str]:
    """Test id -> status, as the SWE-bench harness reads ``log`` with ``parser``."""
    registry = _registry()
    if parser not in registry:
        raise Unavailable(f"swebench has no log parser {parser!r} (known: {', '.join(sorted(registry)[:8])}, ...)")
    spec = SimpleNamespace(instance_id=instance_id, repo=repo, version="", log_parser=parser)
    found = registry[parser](log, spec)
    return {str(test): str(status) for test, status in found.items() if str(status) in STATUSES}
