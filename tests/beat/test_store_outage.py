"""The store unreachable for a while: no beat sends anything it could not claim, and the
runs missed meanwhile follow the entry's catch-up policy once the store is back."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from celery_recovery.beat.publish import run_task_id
from tests.beat.conftest import queued_runs, wait_for_leader
from tests.proxy import TcpProxy
from tests.workers import wait_for

pytestmark = pytest.mark.slow

EVERY_SECOND = {"every-second": {"task": "lifecycle.noop", "every": 1.0}}


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_beats_cut_off_from_the_store_send_nothing_and_catch_up_once_after(
    store, pg_url, start_ha_beat, broker_urls, queue
):
    proxy = TcpProxy("127.0.0.1", 5432).start()
    through_proxy = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    restored = False
    try:
        # Given two beats that reach the store through a proxy
        beats = [start_ha_beat(EVERY_SECOND, database_url=through_proxy) for _ in range(2)]
        wait_for_leader(store, beats)
        wait_for(lambda: len(queued_runs(broker_urls[0], queue)) >= 3, 30, what="runs")

        # When the store is cut off for 4 s
        proxy.cut()
        cut = time.monotonic()
        # (a publish already claimed when the cut came may still go out)
        wait_for(lambda: time.monotonic() - cut > 0.5, 2, 0.05, "the cut to settle")
        sent_before = len(queued_runs(broker_urls[0], queue, copies=True))
        wait_for(lambda: time.monotonic() - cut > 4, 6, 0.1, "the outage")
        during = len(queued_runs(broker_urls[0], queue, copies=True)) - sent_before
        row_before = store.beat.entry("every-second")
        proxy.start()
        restored = True

        # Then nothing was sent while no beat could claim
        assert during == 0
        # and once it is back, a leader sends the newest missed run once and goes on
        wait_for(
            lambda: (
                store.beat.entry("every-second")["last_run_at"]
                > row_before["last_run_at"] + __import__("datetime").timedelta(seconds=7)
            ),
            20,
            what="the schedule to go on",
        )
    finally:
        if not restored:
            proxy.start()
    runs = queued_runs(broker_urls[0], queue, copies=True)
    times = Counter(at for *_, at in queued_runs(broker_urls[0], queue))
    assert all(n == 1 for n in times.values()), [t for t, n in times.items() if n > 1]
    # A run whose publish went out just as the cut came, and whose send could not be
    # recorded, is sent again afterwards as a marked copy under the same task id (a
    # worker drops it once the first started; docs/beat.md, Limits): only such a run.
    copies = Counter(at for *_, at in runs) - times
    assert all(at in times and at <= row_before["last_run_at"] for at in copies), copies
    assert sum(copies.values()) <= 1, copies
    assert all(task_id == run_task_id("every-second", at) for _, task_id, at in runs)
    row = store.beat.entry("every-second")
    gap = [t for t in times if row_before["last_run_at"] < t]
    first = min(times)
    span = round((row["last_run_at"] - first).total_seconds()) + 1
    assert len([t for t in times if t <= row["last_run_at"]]) + row["missed_count"] == span
    assert row["missed_count"] >= 3, row
    assert gap, "no run after the outage"
