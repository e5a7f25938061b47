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
