"""Flags become settings overrides: a flag given on the command line beats every variable."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any


def overrides(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The flags among ``names`` (and the global ``--log-level``) that were given."""
    chosen = {name: getattr(args, name, None) for name in (*names, "log_level")}
    return {name: value for name, value in chosen.items() if value is not None}
