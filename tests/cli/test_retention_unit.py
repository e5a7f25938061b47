"""Pure logic of retention: what ``--before`` means, and which tables are chosen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.sweeps.retention import check_tables, parse_cutoff

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "age"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        (" 1.5D ", timedelta(days=1.5)),
        (3600, timedelta(hours=1)),
        (timedelta(days=3), timedelta(days=3)),
    ],
)
def test_ages_count_back_from_now(value, age):
    assert parse_cutoff(value, NOW) == NOW - age


def test_iso_timestamps_are_utc_unless_they_say_otherwise():
    assert parse_cutoff("2025-05-01T00:00:00", NOW) == datetime(2025, 5, 1, tzinfo=UTC)
    assert parse_cutoff("2025-05-01T02:00:00+02:00", NOW) == datetime(2025, 5, 1, tzinfo=UTC)
    aware = datetime(2025, 5, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    assert parse_cutoff(aware, NOW) == datetime(2025, 5, 1, tzinfo=UTC)


@pytest.mark.parametrize("value", ["", "30", "d30", "30 days", "tomorrow", "-5d", "2025-13-01"])
def test_anything_else_is_refused_with_the_accepted_forms(value):
    with pytest.raises(ConfigurationError, match=r"ISO 8601 timestamp .* nor an age"):
        parse_cutoff(value, NOW)


def test_a_future_cutoff_is_refused():
    with pytest.raises(ConfigurationError, match="in the future"):
        parse_cutoff("2025-06-02", NOW)


def test_tables_default_to_all_in_purge_order_and_unknown_ones_are_named():
    assert check_tables(None) == (
        "callbacks",
        "triggers",
        "reservations",
        "task_records",
        "jobs",
        "revocations",
        "claims",
        "audit_log",
        "task_heartbeats",
    )
    assert check_tables(["jobs", "callbacks"]) == ("callbacks", "jobs")
    with pytest.raises(ConfigurationError, match="unknown table leases"):
        check_tables(["leases"])
