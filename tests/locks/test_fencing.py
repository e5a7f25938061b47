"""The lock primitive against real Redis: tokens grow, and a paused holder is fenced off."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import redis

from celery_recovery.locks import ACQUIRED, DONE, HELD, IdempotencyLocks
from tests.services import BROKER_DB
from tests.workers import ROOT, wait_for

HOLDER = """
import sys, time
from celery_recovery.locks import IdempotencyLocks
locks = IdempotencyLocks.from_url(sys.argv[1])
got = locks.acquire(sys.argv[2], "paused-holder", 1.0)
print(got.outcome, got.token, flush=True)
sys.stdin.readline()          # the test SIGSTOPs us here, then SIGCONTs and writes a line
print(locks.renew(sys.argv[2], got.value, 1.0), locks.release(sys.argv[2], got.value, '"mine"', 60),
      flush=True)
"""


@pytest.fixture
def locks(redis_service):
    return IdempotencyLocks.from_url(f"{redis_service}/{BROKER_DB}")


def test_tokens_grow_and_only_the_holder_renews_or_releases(locks):
    key = f"k-{uuid.uuid4().hex}"
    first = locks.acquire(key, "a", 5)
    assert first.outcome == ACQUIRED
    held = locks.acquire(key, "b", 5)
    assert held.outcome == HELD and held.holder == "a" and held.token == first.token
    assert not locks.renew(key, "b|999", 5) and not locks.release(key, "b|999", None, 5)
    assert locks.renew(key, first.value, 5)
    assert locks.release(key, first.value, '{"x": 1}', 5)
    done = locks.acquire(key, "c", 5)
    assert done.outcome == DONE and done.result == '{"x": 1}'  # the stored result, no lock


def test_a_paused_holder_cannot_renew_or_release_after_a_newer_attempt(locks, redis_service):
    key = f"paused-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, f"{redis_service}/{BROKER_DB}", key],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        outcome, token = proc.stdout.readline().split()
        assert outcome == ACQUIRED
        os.kill(proc.pid, signal.SIGSTOP)
        # Its 1 s lease runs out while it is stopped; a new attempt takes the key.
        newer = wait_for(
            lambda: (got := locks.acquire(key, "newer", 30)).outcome == ACQUIRED and got,
            5,
            interval=0.1,
            what="the lease to expire",
        )
        assert newer.token > int(token)
        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["False", "False"]
        assert locks.holder_of(key)[:2] == ("newer", newer.token)
        client = redis.Redis.from_url(f"{redis_service}/{BROKER_DB}")
        assert client.get(locks.result_key(key)) is None
    finally:
        proc.kill()
        proc.wait()


def test_lease_expires_when_nobody_renews(locks):
    key = f"exp-{uuid.uuid4().hex}"
    assert locks.acquire(key, "a", 0.3).outcome == ACQUIRED
    wait_for(lambda: locks.acquire(key, "b", 5).outcome == ACQUIRED, 3, what="expiry")


def test_a_lease_its_task_released_is_not_reported_lost(locks, caplog):
    """Found by the chaos run: every finished @recoverable task used to log 'was lost'."""
    from celery_recovery.locks.renewal import LeaseRenewer

    caplog.set_level("WARNING", logger="celery_recovery.locks")
    renewer = LeaseRenewer(locks)
    prefix = f"renew-{uuid.uuid4().hex}"
    # Given tasks that, one after the other in a process, hold a key briefly and release it
    for i in range(5):
        got = locks.acquire(f"{prefix}-{i}", f"task-{i}", 3.0)
        renewer.hold(f"{prefix}-{i}", got.value, 3.0)
        time.sleep(0.1)  # the task body
        renewer.drop(f"{prefix}-{i}")
        assert locks.release(f"{prefix}-{i}", got.value, "null", 60)
    # When a last key is held long enough to be renewed (its lease is pushed back up)
    last = f"{prefix}-last"
    got = locks.acquire(last, "task-last", 0.9)
    renewer.hold(last, got.value, 0.9)
    lock_key = locks.lock_key(last)
    wait_for(lambda: locks.client.pttl(lock_key) < 700, 5, what="the lease to run down")
    wait_for(lambda: locks.client.pttl(lock_key) > 800, 5, what="the lease to be renewed")
    # Then no released key was reported lost
    assert "was lost" not in caplog.text
    # But a lease really taken away (expired, or taken by a newer attempt) still is
    locks.client.delete(lock_key)
    wait_for(lambda: "was lost" in caplog.text, 5, what="the lost lease to be reported")
    assert last in caplog.text and f"{prefix}-0" not in caplog.text
