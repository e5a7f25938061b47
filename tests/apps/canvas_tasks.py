"""Tasks for the canvas crash tests: header parts, chain steps and chord bodies.

Each step and body counts its completed runs with a Redis ``INCR`` the test
reads, so a body published twice shows as a count of 2; a run in progress
is listed under ``<prefix>:running`` (a killed one stays there with its pid).  A part returns the
pid that ran it: a part re-run after a crash returns another value, which a
chord must still record only once.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery


class _Counted:
    def __init__(self, counter: str, name: str) -> None:
        url, _, self.prefix = counter.rpartition("#")
        self.client = redis.Redis.from_url(url)
        self.run = f"{name}:{os.getpid()}"
        self.name = name

    def __enter__(self) -> None:
        self.client.sadd(f"{self.prefix}:running", self.run)

    def __exit__(self, *exc: object) -> None:
        with self.client.pipeline() as pipe:
            pipe.srem(f"{self.prefix}:running", self.run)
            pipe.incr(f"{self.prefix}:done:{self.name}")
            pipe.execute()


def register(app: Celery) -> None:
    @app.task(shared=False, name="canvas.part", bind=True, max_retries=3)
    def part(self, x, seconds):
        """Long only on its first try (the one a test may kill)."""
        time.sleep(seconds if self.request.retries == 0 else 0.1)
        return [x, os.getpid()]

    @app.task(shared=False, name="canvas.step", bind=True, max_retries=3)
    def step(self, previous, x, seconds, counter):
        with _Counted(counter, f"step{x}"):
            time.sleep(seconds if self.request.retries == 0 else 0.1)
        return x

    @app.task(shared=False, name="canvas.body", bind=True, max_retries=3)
    def body(self, results, seconds, counter, name):
        with _Counted(counter, name):
            time.sleep(seconds if self.request.retries == 0 else 0.1)
        return sorted(r[0] for r in results)
