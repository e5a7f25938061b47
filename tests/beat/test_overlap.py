"""Overlap policies with a real beat and worker: a run longer than the entry's interval."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from celery_recovery.beat.publish import run_task_id
from tests.workers import wait_for

pytestmark = pytest.mark.slow

RUN_SECONDS = 2.5


def spans(path):
    """(task id, start, end) of each finished run, in the order they ended."""
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(task_id, float(start), float(end)) for task_id, _, start, end in rows]


def assert_one_at_a_time(runs):
    ordered = sorted(runs, key=lambda r: r[1])
    for (_, _, end), (task_id, start, _) in pairwise(ordered):
        assert start >= end - 0.05, f"{task_id} started {end - start:.2f}s before the last ended"


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_skip_and_buffer_one_never_run_an_entry_twice_at_once(
    store, start_ha_beat, start_beat_worker, tmp_path
):
    # Given a 1 s entry whose run lasts 2.5 s, under each overlap policy, and a worker
    # with room to run several at once
    skipped, buffered = tmp_path / "skip.txt", tmp_path / "buffer.txt"
    schedule = {
        name: {
            "task": "beat.span",
            "every": 1.0,
            "args": [str(path), RUN_SECONDS],
            "options": {"recovery": {"overlap": overlap}},
        }
        for name, path, overlap in (
            ("skipper", skipped, "skip"),
            ("buffered", buffered, "buffer_one"),
        )
    }
    start_beat_worker(pool="prefork", concurrency=4)
    start_ha_beat(schedule)

    # When three runs of each have finished
    wait_for(lambda: min(len(spans(skipped)), len(spans(buffered))) >= 3, 40, what="runs")

    # Then neither entry ever ran twice at once
    for path in (skipped, buffered):
        runs = spans(path)
        assert_one_at_a_time(runs)
        assert len({task_id for task_id, *_ in runs}) == len(runs)
    # and buffer_one starts the held run as soon as the previous one ends
    ordered = sorted(spans(buffered), key=lambda r: r[1])
    gaps = [b[1] - a[2] for a, b in pairwise(ordered)]
    assert max(gaps) < 1.5, gaps
    # and skip recorded the runs it skipped, and why
    rows = {row["name"]: row for row in store.beat.entries()}
    assert rows["skipper"]["missed_count"] >= 2
    with store.transaction() as conn:
        reasons = Counter(
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT reason FROM audit_log WHERE action = 'beat_skipped'"
            )
        )
    assert reasons["beat_overlap"] >= 2
    assert (
        run_task_id("skipper", rows["skipper"]["last_sent_run_at"])
        == rows["skipper"]["last_task_id"]
    )
