"""The loop watchdog's arithmetic, with the clock driven by the test.

``test_deferral`` runs the real thing (a trigger that blocks a triggerer's
loop); this pins the case a busy machine produces there: the watching
thread sees the block once, early, and is not scheduled again until the
loop is free.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from celery_recovery.triggerer.watchdog import TICK, LoopWatchdog


@pytest.fixture
def watchdog():
    loop = asyncio.new_event_loop()
    reported: list[tuple[str, float]] = []
    dog = LoopWatchdog(loop, 0.2, on_blocked=lambda name, seconds: reported.append((name, seconds)))
    dog.last_tick = 100.0
    dog.reported = reported  # type: ignore[attr-defined]
    yield dog
    loop.close()


def test_the_total_is_the_loops_own_gap_when_the_watcher_looked_only_once(watchdog, caplog):
    caplog.set_level(logging.WARNING, "celery_recovery.triggerer")
    watchdog.look(100.21)  # the one look during the block
    assert "has blocked the triggerer's event loop for 0.21s" in caplog.text
    watchdog.tick(100.0 + TICK + 0.8)  # the loop is free after 0.8 s
    watchdog.look(101.0)
    assert watchdog.reported == [("the triggerer itself", pytest.approx(0.8))]
    assert "blocked the event loop for 0.80s in all" in caplog.text


def test_the_total_is_the_watchers_look_when_it_saw_more(watchdog):
    watchdog.look(100.3)
    watchdog.look(100.6)
    watchdog.tick(100.62)  # a tick stamped late: the loop's own gap is smaller
    watchdog.look(100.63)
    assert watchdog.reported == [("the triggerer itself", pytest.approx(0.6))]


def test_an_earlier_stall_does_not_inflate_a_blocks_total(watchdog):
    watchdog.tick(100.0 + TICK + 0.5)  # a stall the watcher never saw
    start = watchdog.last_tick
    watchdog.look(start + 0.25)
    watchdog.tick(start + TICK + 0.3)
    watchdog.look(start + 0.4)
    assert watchdog.reported == [("the triggerer itself", pytest.approx(0.3))]


def test_short_stalls_are_not_reported(watchdog):
    for step in range(1, 20):
        watchdog.tick(100.0 + step * (TICK + 0.1))
        watchdog.look(watchdog.last_tick + 0.1)
    assert watchdog.reported == []


def test_each_block_is_reported_once(watchdog):
    watchdog.look(100.5)
    watchdog.tick(100.0 + TICK + 0.5)
    watchdog.look(100.6)
    watchdog.look(100.61)
    watchdog.tick(100.7)
    watchdog.look(100.72)
    assert len(watchdog.reported) == 1


def _running(watchdog, name: str) -> None:
    """What the watching thread sees running on the loop from now on."""
    watchdog._running_task = lambda: name


def test_a_stall_passed_from_one_task_to_the_next_names_each_for_its_share(watchdog, caplog):
    """The claim loop blocks (a slow import) and, without the loop ticking, the trigger it
    started blocks next: the trigger is named for its own block, not hidden in the first."""
    caplog.set_level(logging.WARNING, "celery_recovery.triggerer")
    _running(watchdog, "the triggerer's claim loop")
    watchdog.look(100.21)
    watchdog.look(100.4)
    _running(watchdog, "trigger 7 (Sleep)")
    watchdog.look(100.45)  # the claim loop let go; the trigger's share is 0.05 s yet
    assert "trigger 7 (Sleep) has blocked" not in caplog.text
    watchdog.look(100.7)
    assert "trigger 7 (Sleep) has blocked the triggerer's event loop for 0.30s" in caplog.text
    watchdog.tick(100.0 + TICK + 1.2)  # the loop is free again after 1.2 s in all
    watchdog.look(101.3)
    assert watchdog.reported == [
        ("the triggerer's claim loop", pytest.approx(0.4)),
        ("trigger 7 (Sleep)", pytest.approx(0.8)),
    ]


def test_a_task_that_holds_a_stall_below_the_threshold_is_not_named(watchdog):
    _running(watchdog, "the triggerer's claim loop")
    watchdog.look(100.3)
    _running(watchdog, "trigger 8 (Quick)")
    watchdog.look(100.35)
    _running(watchdog, "the triggerer's claim loop")
    watchdog.look(100.4)
    watchdog.tick(100.0 + TICK + 0.45)
    watchdog.look(100.5)
    # The claim loop's second turn (0.1 s) is under the threshold too.
    assert watchdog.reported == [("the triggerer's claim loop", pytest.approx(0.3))]
