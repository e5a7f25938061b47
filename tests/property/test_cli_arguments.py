"""Any value of the CLI's options: exit 0, 1 or 2; a refusal is one ``Error:`` line,
never a traceback; and nothing a refused (or dry-run) command does changes the store."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from celery_recovery.cli import recovery as cli
from celery_recovery.store import Store
from celery_recovery.store.schema import metadata
from tests.builders import add_job, add_trigger, add_try
from tests.property.strategies import FAST

numbers = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats().map(str),
    st.sampled_from(["nan", "inf", "-inf", "1e309", "0", "-0", "0x10", "1_000", " 5 ", ""]),
)
ages = st.one_of(
    numbers.map(lambda n: n + "d"),
    st.builds(lambda n, u: f"{n}{u}", st.integers(-5, 10**12), st.sampled_from("smhdwy ")),
    st.sampled_from(["30d", "2024-05-01T00:00:00Z", "2999-01-01", "yesterday", "1d2h", "P1D"]),
    st.text(max_size=20),
)
states = st.one_of(
    st.sampled_from(["failed", "running", "FAILED", "done", ""]), st.text(max_size=8)
)
job_types = st.one_of(
    st.sampled_from(["worker", "beat", "triggerer", "Worker"]), st.text(max_size=8)
)

commands = st.one_of(
    st.builds(
        lambda b, n: ["db", "clean", "--before", b, "--batch-size", n, "--dry-run"], ages, numbers
    ),
    st.builds(lambda n, s: ["inspect", "tasks", "--limit", n, "--state", s], numbers, states),
    st.builds(lambda j, n: ["inspect", "jobs", "--job-type", j, "--limit", n], job_types, numbers),
    st.builds(lambda n: ["inspect", "zombies", "--limit", n, "--json"], numbers),
    st.builds(
        lambda j, t: ["jobs", "check", "--job-type", j, "--threshold", t], job_types, numbers
    ),
)


@pytest.fixture(scope="module")
def populated() -> Iterator[tuple[str, Store]]:
    """A SQLite store with a job, finished and running tries and a trigger."""
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'cli-property.sqlite3'}"
        store = Store(url)
        store.ensure_ready()
        job = add_job(store, heartbeat_age=1.0)
        add_try(store, "failed", ended_age=10 * 86400)
        running = add_try(store, "running", job_id=job)
        add_trigger(store, running, None)
        yield url, store
        store.dispose()


def snapshot(store: Store) -> dict[str, list]:
    with store.transaction() as conn:
        return {
            table.name: sorted(map(repr, conn.execute(table.select()).all()))
            for table in metadata.sorted_tables
        }


@settings(FAST, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=commands)
@example(command=["jobs", "check", "--job-type", "worker", "--threshold", "nan"])
@example(command=["jobs", "check", "--job-type", "worker", "--threshold", "inf"])
@example(command=["db", "clean", "--before", "1e309d", "--batch-size", "1", "--dry-run"])
@example(command=["db", "clean", "--before", "99999999999999d", "--batch-size", "1", "--dry-run"])
@example(command=["inspect", "tasks", "--limit", "99999999999999999999", "--state", "failed"])
def test_any_option_value_exits_0_1_or_2_without_traceback_or_change(populated, command):
    url, store = populated
    before = snapshot(store)
    result = CliRunner().invoke(cli, ["--database-url", url, *command])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        command,
        result.output,
        result.exception,
    )
    assert result.exit_code in (0, 1, 2), (command, result.output)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, (command, result.output)
    if command[:2] == ["jobs", "check"] and result.exit_code == 0:
        assert result.output.startswith("OK: ") and len(result.output.splitlines()) == 1
    assert snapshot(store) == before


@pytest.mark.parametrize("threshold", ["nan", "inf", "NaN", "-nan"])
def test_a_non_finite_probe_threshold_is_refused_not_passed(populated, threshold):
    """NaN compares false with every heartbeat age: accepted, a dead job would pass."""
    url, _ = populated
    args = ["--database-url", url, "jobs", "check", "--job-type", "worker"]
    result = CliRunner().invoke(cli, [*args, "--threshold", threshold])
    assert result.exit_code == 2 and "not a finite number" in result.output, result.output
