"""Unit tests of the write-behind buffer's pure logic (a fake store stands in for the database).

The real-store behaviour (outage, return, bounded warnings) is covered by
tests/runtime/test_store_outage.py with real workers and PostgreSQL.
"""

from __future__ import annotations

import threading
import time

from celery_recovery.core.errors import StoreError, StoreUnavailableError
from celery_recovery.core.records import Transition
from celery_recovery.core.states import TaskState
from celery_recovery.runtime.health import StoreHealth
from celery_recovery.runtime.write_behind import RESERVATION_BURST, WriteBehindWriter


class FakeStore:
    def __init__(self) -> None:
        self.applied: list[tuple[str, object]] = []
        self.down = False
        self.poison: set[object] = set()
        self.lock = threading.Lock()

    def apply_writes(self, writes):
        if self.down:
            raise StoreUnavailableError("down")
        if self.poison and any(item in self.poison for _, item in writes):
            raise StoreError("bad row")
        with self.lock:
            self.applied.extend(writes)


def make_writer(store, **kwargs):
    health = StoreHealth("fake", backoff_initial=0.01, backoff_max=0.05)
    return WriteBehindWriter(store, health, flush_interval=0.01, **kwargs), health


def test_writes_are_applied_in_order():
    store = FakeStore()
    writer, _ = make_writer(store)
    for i in range(200):
        writer.submit("queued", i)
    assert writer.flush(5)
    assert [item for _, item in store.applied] == list(range(200))


def test_writes_wait_out_an_outage_and_keep_their_order():
    store = FakeStore()
    store.down = True
    writer, health = make_writer(store)
    for i in range(10):
        writer.submit("queued", i)
    assert not writer.flush(0.3)
    assert health.down and health.failures >= 1 and store.applied == []
    store.down = False
    assert writer.flush(5)
    assert [item for _, item in store.applied] == list(range(10))
    assert not health.down


def test_buffer_is_bounded_and_drops_the_oldest_during_an_outage():
    store = FakeStore()
    store.down = True
    writer, health = make_writer(store, max_pending=5)
    for i in range(12):
        writer.submit("queued", i)
    assert health.dropped == 7
    store.down = False
    assert writer.flush(5)
    assert [item for _, item in store.applied] == [7, 8, 9, 10, 11]


def test_one_unwritable_row_does_not_block_the_others():
    store = FakeStore()
    store.poison.add(3)
    writer, _ = make_writer(store)
    for i in range(6):
        writer.submit("queued", i)
    assert writer.flush(5)
    assert [item for _, item in store.applied] == [0, 1, 2, 4, 5]


def _claim(task_id: str) -> dict:
    return {"task_id": task_id, "try_number": 1, "state": TaskState.RUNNING}


def _success(task_id: str) -> Transition:
    return Transition(task_id, 1, (TaskState.RUNNING,), {"state": TaskState.SUCCESS})


def test_a_claim_is_written_within_the_claim_interval_and_takes_waiting_writes_along():
    store = FakeStore()
    health = StoreHealth("fake")
    writer = WriteBehindWriter(store, health, flush_interval=60, claim_interval=0.02)
    writer.submit("queued", "published before")
    writer.submit("running", _claim("t1"))
    deadline = time.monotonic() + 5
    while len(store.applied) < 2:
        assert time.monotonic() < deadline, "the claim waited for the flush interval"
        time.sleep(0.01)
    assert [kind for kind, _ in store.applied] == ["queued", "running"]


def test_an_outcome_is_folded_into_its_waiting_claim():
    store = FakeStore()
    health = StoreHealth("fake")
    writer = WriteBehindWriter(store, health, flush_interval=60, claim_interval=60)
    writer.submit("running", _claim("t1"))
    writer.submit("transition", _success("t1"))
    writer.submit("transition", _success("other"))  # its claim was written earlier
    assert writer.flush(5)
    assert store.applied == [
        ("running", {**_claim("t1"), "state": TaskState.SUCCESS}),
        ("transition", _success("other")),
    ]


def test_a_built_write_is_dropped_if_superseded_when_its_batch_is_taken():
    """A worker's main process records a held message only if no pool process has
    started it by the time the batch is written (the started try's claim covers it)."""
    store = FakeStore()
    writer, _ = make_writer(store)
    started = {"a": False, "b": False}

    def unless_started(key: str):
        return None if started[key] else (key, 1)

    writer.submit_built("reserved", unless_started, "a")
    writer.submit_built("reserved", unless_started, "b")
    writer.submit("queued", "c")
    started["a"] = True  # handed to a pool process before the flush
    assert writer.flush(5)
    assert store.applied == [("reserved", ("b", 1)), ("queued", "c")]


def test_a_built_write_is_built_in_the_flusher_thread_and_keeps_its_place():
    """A publisher's record is built from what its handler captured, off the caller's path."""
    store = FakeStore()
    writer, _ = make_writer(store)
    built_in: list[str] = []

    def build(source: str) -> str:
        built_in.append(threading.current_thread().name)
        return source.upper()

    writer.submit("queued", "a")
    writer.submit_built("queued", build, "b")
    writer.submit("queued", "c")
    assert writer.flush(5)
    assert store.applied == [("queued", "a"), ("queued", "B"), ("queued", "c")]
    assert built_in == ["celery-recovery-writer"]


def test_a_record_that_cannot_be_built_is_dropped_alone():
    store = FakeStore()
    writer, _ = make_writer(store)

    def broken(source: str) -> str:
        raise TypeError("a value the record cannot hold")

    writer.submit_built("queued", broken, "a")
    writer.submit_built("queued", str.upper, "b")
    assert writer.flush(5)
    assert store.applied == [("queued", "B")]


def test_a_built_write_kept_through_an_outage_is_built_once():
    store = FakeStore()
    store.down = True
    writer, _ = make_writer(store)
    builds: list[str] = []

    def build(source: str) -> str:
        builds.append(source)
        return source.upper()

    writer.submit_built("queued", build, "a")
    assert not writer.flush(0.2)
    store.down = False
    assert writer.flush(5)
    assert store.applied == [("queued", "A")] and builds == ["a"]


class TimedStore(FakeStore):
    """Remembers when each batch was applied (monotonic seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[float, list]] = []

    def apply_writes(self, writes):
        super().apply_writes(writes)
        self.batches.append((time.monotonic(), [item for _, item in writes]))


def test_a_reservation_on_a_quiet_writer_is_written_within_the_claim_interval():
    """A worker's main process that took a message while nothing else was being written
    commits its reservation at once: killed a moment later, the prefetched message is
    still published again with its running tasks (the demo's case)."""
    store = TimedStore()
    writer = WriteBehindWriter(store, StoreHealth("fake"), flush_interval=60, claim_interval=0.02)
    writer.submit("audit", "written later")
    submitted = time.monotonic()
    writer.submit_built("reserved", lambda source: source, "held")
    deadline = submitted + 5
    while not store.batches:
        assert time.monotonic() < deadline, "the reservation waited for the flush interval"
        time.sleep(0.005)
    at, items = store.batches[0]
    assert items == ["written later", "held"] and at - submitted < 1.0


def _wait_for_batches(store, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(store.batches) < n:
        assert time.monotonic() < deadline, f"only {len(store.batches)} of {n} batches written"
        time.sleep(0.002)


def test_reservations_taken_back_to_back_by_a_quiet_writer_are_each_written_at_once():
    """The demo's worker takes its first message, commits its reservation, then takes the
    next as the first task starts: that one is written within the claim interval too, not
    a flush interval after the first commit (a kill then lost it to the queued timeout)."""
    store = TimedStore()
    writer = WriteBehindWriter(store, StoreHealth("fake"), flush_interval=60, claim_interval=0.01)
    for n, name in enumerate(["first", "next", "and one more"], start=1):
        submitted = time.monotonic()
        writer.submit_built("reserved", lambda source: source, name)
        _wait_for_batches(store, n)
        at, items = store.batches[-1]
        assert items == [name] and at - submitted < 1.0


def test_reservations_of_a_busy_writer_still_share_a_commit_per_flush_interval():
    """Past its few prompt commits, a busy main process commits once per flush interval,
    whatever the rate of messages it takes."""
    store = TimedStore()
    writer = WriteBehindWriter(store, StoreHealth("fake"), flush_interval=0.5, claim_interval=0.01)
    for n in range(1, RESERVATION_BURST + 1):
        writer.submit_built("reserved", lambda source: source, f"prompt {n}")
        _wait_for_batches(store, n)
    last_prompt = store.batches[-1][0]
    for name in ("second", "third"):
        writer.submit_built("reserved", lambda source: source, name)
    _wait_for_batches(store, RESERVATION_BURST + 1)
    at, items = store.batches[-1]
    assert items == ["second", "third"]
    assert at - last_prompt >= 0.4, "a busy writer committed again within the flush interval"
    # The next commit waits a whole flush interval again: spending the credit does not
    # leave any behind.
    writer.submit_built("reserved", lambda source: source, "fourth")
    _wait_for_batches(store, RESERVATION_BURST + 2)
    assert store.batches[-1][0] - at >= 0.45
