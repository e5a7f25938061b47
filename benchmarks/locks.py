"""Per-task overhead of @recoverable: Redis round trips and microseconds, in one run.

Calls the same task body inside a real Celery task context (``task.apply``,
eager, so the broker is not measured) with and without ``@recoverable``,
alternating, against the local Redis.  Prints JSON.

    python benchmarks/locks.py --tasks 2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import redis
from celery import Celery

from celery_recovery import Recovery, recoverable

REDIS = "redis://127.0.0.1:6379/15"


def build_app() -> tuple[Celery, Recovery]:
    app = Celery("bench-locks", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_store_eager_result = False
    recovery = Recovery(
        app, database_url="sqlite:////tmp/celery-recovery-bench-locks.sqlite3", redis_url=REDIS
    )

    @app.task(name="bench.plain", shared=False)
    def plain(order_id):
        return order_id

    @app.task(name="bench.guarded", shared=False)
    @recoverable(idempotency_key="bench:{order_id}", result_ttl=60)
    def guarded(order_id):
        return order_id

    return app, recovery


class RoundTrips:
    """Counts requests sent to Redis (a pipeline or a script call is one)."""

    def __init__(self) -> None:
        self.count = 0
        original = redis.connection.AbstractConnection.send_packed_command

        def counting(conn, command, check_health=True):  # type: ignore[no-untyped-def]
            self.count += 1
            return original(conn, command, check_health)

        redis.connection.AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    app, recovery = build_app()
    client = redis.Redis.from_url(REDIS)
    client.flushdb()
    plain, guarded = app.tasks["bench.plain"], app.tasks["bench.guarded"]
    trips = RoundTrips()
    plain_us, guarded_us, round_trips = [], [], []
    for _ in range(args.rounds):
        ids = [uuid.uuid4().hex for _ in range(args.tasks)]
        start = time.perf_counter()
        for i in ids:
            plain.apply((i,))
        plain_us.append((time.perf_counter() - start) / args.tasks * 1e6)
        before = trips.count
        start = time.perf_counter()
        for i in ids:
            guarded.apply((i,))
        guarded_us.append((time.perf_counter() - start) / args.tasks * 1e6)
        round_trips.append((trips.count - before) / args.tasks)
    recovery.close()
    print(
        json.dumps(
            {
                "tasks": args.tasks,
                "plain_us_per_task": round(statistics.median(plain_us), 1),
                "recoverable_us_per_task": round(statistics.median(guarded_us), 1),
                "overhead_us_per_task": round(
                    statistics.median(guarded_us) - statistics.median(plain_us), 1
                ),
                "redis_round_trips_per_task": round(statistics.median(round_trips), 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
