"""What stuck-work detection costs: ``heartbeat()`` in a tight loop, and the consumer
watch's share of every received message.  Prints JSON.

    python benchmarks/stuck_costs.py --calls 200000

``heartbeat()`` runs inside a task context as a worker's pool process has it
(not eager), against a SQLite store; its writes happen on the buffer's thread.
The consumer watch's per-message cost is its ``task_received`` receiver.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from celery import Celery
from celery._state import _task_stack

from celery_recovery import Recovery, heartbeat
from celery_recovery.stalls import watch as stall_watch


def per_call(func, calls: int) -> float:
    """Microseconds per call, the best of three runs."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        for i in range(calls):
            func(i)
        best = min(best, (time.perf_counter() - began) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    calls = parser.parse_args().calls
    app = Celery("bench-stuck", broker="memory://", set_as_current=False)
    Recovery(app, database_url=f"sqlite:////tmp/celery-recovery-bench-{uuid.uuid4().hex}.sqlite3")

    @app.task(name="bench.beating", shared=False)
    def beating():
        return None

    beating.push_request(id=uuid.uuid4().hex, retries=0, is_eager=False, called_directly=False)
    _task_stack.push(beating)
    try:
        bare = per_call(lambda i: heartbeat(), calls)
        detailed = per_call(lambda i: heartbeat({"done": i}), calls)
    finally:
        _task_stack.pop()
        beating.pop_request()

    class Watched:
        last_received = 0.0

    stall_watch._watch = Watched()  # type: ignore[assignment]
    received = per_call(lambda i: stall_watch.on_received(), calls)
    stall_watch._watch = None
    print(
        json.dumps(
            {
                "calls": calls,
                "heartbeat_us": round(bare, 3),
                "heartbeat_with_details_us": round(detailed, 3),
                "consumer_watch_per_message_us": round(received, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
