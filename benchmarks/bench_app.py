"""The app the benchmarks' workers run: a no-op task, with or without celery-recovery.

``BENCH_PLAIN=1`` runs plain Celery; otherwise ``Recovery(app)`` is installed
and configured by the ``CELERY_RECOVERY_*`` environment variables.
``BENCH_ACKS_LATE=1`` makes the task ``acks_late`` (its claim is then
committed before the body runs, to count the deaths of its processes).
``BENCH_HANDLER_CPU=<dir>`` measures the handlers' CPU (``handler_cpu.py``).
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery("bench")
app.conf.update(
    broker_url=os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/11"),
    result_backend=os.environ.get("BENCH_BACKEND", "redis://127.0.0.1:6379/12"),
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    broker_connection_retry_on_startup=True,
)

if os.environ.get("BENCH_PLAIN") != "1":
    from celery_recovery import Recovery

    recovery = Recovery(app)
    if os.environ.get("BENCH_HANDLER_CPU"):
        # Measure celery-recovery's own code where it runs (throughput.py --handlers).
        from handler_cpu import install

        install(os.environ["BENCH_HANDLER_CPU"])


@app.task(name="bench.noop", acks_late=os.environ.get("BENCH_ACKS_LATE") == "1")
def noop(i):
    return i
