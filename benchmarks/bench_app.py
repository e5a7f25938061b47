"""The app the benchmarks' workers run: a no-op task, with or without celery-recovery.

``BENCH_PLAIN=1`` runs plain Celery; otherwise ``Recovery(app)`` is installed
and configured by the ``CELERY_RECOVERY_*`` environment variables.
``BENCH_ACKS_LATE=1`` makes the task ``acks_late`` (its claim is then
committed before the body runs, to count the deaths of its processes).
``BENCH_HANDLER_CPU=<dir>`` measures the handlers' CPU (``handler_cpu.py``).
``BENCH_WITHOUT`` switches one part of celery-recovery off, to tell what each
costs (``throughput.py --without``): ``hooks`` leaves it installed (imports,
jobs, heartbeats, sweeps, writer threads) but records no task (no per-task
handler or task-class hook); ``writes`` records every task but sends no batch
to the store (records are built, then dropped).
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

WITHOUT = os.environ.get("BENCH_WITHOUT", "")
if WITHOUT not in ("", "hooks", "writes"):
    raise SystemExit(f"BENCH_WITHOUT={WITHOUT!r}: expected hooks or writes")

if os.environ.get("BENCH_PLAIN") != "1":
    from celery_recovery import Recovery

    if WITHOUT == "hooks":
        import celery_recovery.signals.tasks

        # Before Recovery(app) hooks the task classes.
        celery_recovery.signals.tasks._hook_every_task = lambda app: None
    elif WITHOUT == "writes":
        from celery_recovery.store.tries import TryRepository

        TryRepository.apply_writes = lambda self, writes: None  # type: ignore[method-assign]

    recovery = Recovery(app)
    if WITHOUT == "hooks":
        from celery import signals
        from handler_cpu import HANDLERS  # the per-task handlers, as --handlers measures them

        for signal_name, module_name, _handler, suffix in HANDLERS:
            getattr(signals, signal_name).disconnect(dispatch_uid=module_name + suffix)
    if os.environ.get("BENCH_HANDLER_CPU"):
        # Measure celery-recovery's own code where it runs (throughput.py --handlers).
        from handler_cpu import install

        install(os.environ["BENCH_HANDLER_CPU"])


@app.task(name="bench.noop", acks_late=os.environ.get("BENCH_ACKS_LATE") == "1")
def noop(i):
    return i
