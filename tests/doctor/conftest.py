"""Private Redis servers, misconfigured and configured well, started per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.servers import PrivateRedis
from tests.services import free_port, require

#: What loses tasks: evicts keys under memory pressure, keeps nothing on disk.
MISCONFIGURED = ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
#: What the doctor asks for: never evicts, writes an append-only file.
WELL_CONFIGURED = ("--maxmemory-policy", "noeviction")


def _private_redis(directory: Path, persistent: bool, options: tuple[str, ...]) -> PrivateRedis:
    # The shared Redis answering shows the machine has redis-server at all.
    require("Redis", "redis://127.0.0.1:6379", 6379)
    directory.mkdir()
    return PrivateRedis(directory, persistent=persistent, options=options).start()


@pytest.fixture
def bad_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = _private_redis(tmp_path / "bad-redis", False, MISCONFIGURED)
    yield server
    server.stop()


@pytest.fixture
def good_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = _private_redis(tmp_path / "good-redis", True, WELL_CONFIGURED)
    yield server
    server.stop()


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on."""
    return free_port()
