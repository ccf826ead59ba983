"""``fd_usage``: the open-files count the proxy exports as ``rollout_proxy_open_fds``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from services.runtime import limits


@pytest.fixture
def opened() -> Iterator[list[int]]:
    fds: list[int] = []
    yield fds
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("listed", [False, True], ids=["stat", "listed"])
def test_fd_usage_counts_every_descriptor_opened_and_closed(
    listed: bool, opened: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    if listed:  # a kernel before 6.2 gives /proc/self/fd a size of 0
        real = os.stat
        monkeypatch.setattr(os, "stat", lambda p: os.stat_result((0,) * 10) if p == "/proc/self/fd" else real(p))
    before, limit = limits.fd_usage()
    opened += [os.open(os.devnull, os.O_RDONLY) for _ in range(300)]
    assert limits.fd_usage() == (before + 300, limit)
    for _ in range(100):
        os.close(opened.pop())
    assert limits.fd_usage()[0] == before + 200
    assert before > 0
