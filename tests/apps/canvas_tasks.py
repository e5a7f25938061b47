"""Tasks for the canvas crash tests: header parts, chain steps and chord bodies.

Each step and body counts its completed runs with a Redis ``INCR`` the test
reads, so a body published twice shows as a count of 2.  With
``RECOVERY_TEST_RUNNING`` set (a Redis URL), every task run in progress (a
``celery.chord_unlock`` too, even one dropped as stale) is listed in the set
``running`` there by pid, so a test can tell when nothing runs any more (a
killed run stays listed with a pid that is gone).  A part returns the
pid that ran it: a part re-run after a crash returns another value, which a
chord must still record only once.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery
from celery.signals import task_postrun, task_prerun

RUNNING_KEY = "running"


def _count(counter: str, name: str) -> None:
    url, _, prefix = counter.rpartition("#")
    redis.Redis.from_url(url).incr(f"{prefix}:done:{name}")


def _running_client() -> redis.Redis | None:
    url = os.environ.get("RECOVERY_TEST_RUNNING")
    return redis.Redis.from_url(url) if url else None


def _on_prerun(task_id: str | None = None, **_: object) -> None:
    client = _running_client()
    if client is not None:
        client.sadd(RUNNING_KEY, f"{task_id}:{os.getpid()}")


def _on_postrun(task_id: str | None = None, **_: object) -> None:
    client = _running_client()
    if client is not None:
        client.srem(RUNNING_KEY, f"{task_id}:{os.getpid()}")


task_prerun.connect(_on_prerun, weak=False, dispatch_uid=__name__ + ".prerun")
task_postrun.connect(_on_postrun, weak=False, dispatch_uid=__name__ + ".postrun")


def register(app: Celery) -> None:
    @app.task(shared=False, name="canvas.part", bind=True, max_retries=3)
    def part(self, x, seconds):
        """Long only on its first try (the one a test may kill)."""
        time.sleep(seconds if self.request.retries == 0 else 0.1)
        return [x, os.getpid()]

    @app.task(shared=False, name="canvas.step", bind=True, max_retries=3)
    def step(self, previous, x, seconds, counter):
        time.sleep(seconds if self.request.retries == 0 else 0.1)
        _count(counter, f"step{x}")
        return x

    @app.task(shared=False, name="canvas.body", bind=True, max_retries=3)
    def body(self, results, seconds, counter, name):
        time.sleep(seconds if self.request.retries == 0 else 0.1)
        _count(counter, name)
        return sorted(r[0] for r in results)
