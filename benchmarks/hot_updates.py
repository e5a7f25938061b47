"""Which of a try's two writes PostgreSQL can make a HOT update, and what each order costs.

A try's row is written twice: the publisher's ``queued`` record and the
worker's claim (carrying the outcome when the task ends within the claim's
window). Whichever lands second is an update. When the claim lands first,
the publisher's update changes no indexed column (its ``queued_at`` is the
claim's, to the microsecond), so with the table's free space (fillfactor 80)
it can be HOT: no new index entries. When the publisher's row lands first,
the worker's update changes ``state`` (the predicate of two partial indexes)
and ``ended_at`` (indexed), so it never is. The publisher's row lands first
whenever a message waits in its queue longer than the publisher's flush
(0.15 s): in ``throughput.py``, which publishes every task at once, the
median wait is 3-4 s.

Both orders are written here the way the writers write them (batches through
``apply_writes``, the records ``hot_path.py`` uses), each into a database of
its own; the report gives the HOT share of ``task_records`` updates and the
server's CPU per try (its backend's CPU in ``/proc``).

    python benchmarks/hot_updates.py --tries 4000 --batch 50
    python benchmarks/hot_updates.py --tries 4000 --batch 50 --fillfactor 50
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.hot_path import _claim, _queued  # noqa: E402
from benchmarks.throughput import (  # noqa: E402
    PG_ADMIN,
    create_database,
    drop_database,
    process_cpu,
    server_pids,
    table_counters,
    wait_for_backends_to_leave,
)

ORDERS = ("claim_first", "queued_first")


def run_order(order: str, tries: int, batch: int, fillfactor: int | None) -> dict[str, Any]:
    from celery_recovery.core.records import WriteKind
    from celery_recovery.core.timeutils import utcnow
    from celery_recovery.store import Store

    name = create_database()
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    if fillfactor is not None:
        from sqlalchemy import create_engine, text

        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"ALTER TABLE task_records SET (fillfactor = {int(fillfactor)})"))
        engine.dispose()
    store = Store(url)
    try:
        now = utcnow()
        pairs = []
        for _ in range(tries):
            claim, queued = _claim(now), _queued(now)
            queued["task_id"] = queued["external_executor_id"] = claim["task_id"]
            pairs.append((claim, queued))
        store.tries.apply_writes([(WriteKind.QUEUED, _queued(now))])  # connect, compile
        before = table_counters(url)
        backends = server_pids(url)
        cpu = process_cpu(backends)
        for start in range(0, tries, batch):
            chunk = pairs[start : start + batch]
            claims = [(WriteKind.RUNNING, claim) for claim, _ in chunk]
            queued = [(WriteKind.QUEUED, record) for _, record in chunk]
            first, second = (claims, queued) if order == "claim_first" else (queued, claims)
            store.tries.apply_writes(first)
            store.tries.apply_writes(second)
        server_cpu = process_cpu(backends) - cpu
        store.dispose()
        wait_for_backends_to_leave(url)
        after = table_counters(url)
    finally:
        store.dispose()
        drop_database(name)
    updates = after["task_updates"] - before["task_updates"]
    return {
        "updates": updates,
        "hot_ratio": round((after["task_hot_updates"] - before["task_hot_updates"]) / updates, 3),
        "server_cpu_ms_per_try": round(server_cpu * 1000 / tries, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=50, help="rows per batch of each writer")
    parser.add_argument(
        "--fillfactor", type=int, help="task_records' fillfactor instead of the migration's 80"
    )
    args = parser.parse_args()
    report: dict[str, Any] = {"tries": args.tries, "batch": args.batch}
    report["fillfactor"] = args.fillfactor or 80
    for order in ORDERS:
        report[order] = run_order(order, args.tries, args.batch, args.fillfactor)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
