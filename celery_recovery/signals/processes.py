"""Jobs: every worker process, beat and triggerer is a job with a heartbeat.

A worker's main process becomes a job at ``worker_ready``: it takes the
messages from the broker, so the messages it holds (prefetched, or waiting
for their ETA) are recorded as reserved by its job.  A prefork worker's pool
children, which run the tasks, each become a job of their own at
``worker_process_init``; pools that run tasks in the main process (solo,
threads, gevent, eventlet) have that one job.  All are ``worker`` jobs.
Clean shutdowns end the job as ``success``; a killed process simply stops
beating.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from celery import current_app
from celery.signals import (
    beat_embedded_init,
    beat_init,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from celery_recovery.core.states import JobState, JobType
from celery_recovery.liveness.job import start_lock_marker
from celery_recovery.liveness.postgres import stop_holder
from celery_recovery.runtime.context import RecoveryContext, context_for_app, installed
from celery_recovery.signals.guard import never_raises
from celery_recovery.signals.reservations import MAIN_PROCESS_FLUSH_INTERVAL
from celery_recovery.stalls import start_watch, stop_watch
from celery_recovery.sweeps.marker_watch import start_marker_watch
from celery_recovery.sweeps.tasks import SWEEP_TASK
from celery_recovery.telemetry import metrics


def _current() -> RecoveryContext | None:
    found = context_for_app(current_app._get_current_object())
    if found is not None:
        return found
    every = installed()
    return every[0] if every else None


#: The worker's node name, read in its main process before the pool forks: Celery 5.5
#: and 5.6 send ``worker_process_init`` without it (5.7 sends it as the sender).
_node_name: str | None = None


@never_raises
def on_worker_init(sender: Any = None, **_: Any) -> None:
    global _node_name
    _node_name = getattr(sender, "hostname", None) or _node_name
    # The main process takes the liveness marker before its pool forks, so that the
    # pool processes share it instead of opening a connection each.
    app = getattr(sender, "app", None)
    context = context_for_app(app) if app is not None else _current()
    if context is not None:
        label = f"worker {getattr(sender, 'hostname', None) or ''}:{os.getpid()}"
        start_lock_marker(context.settings, label)


@never_raises
def on_process_init(sender: Any = None, **_: Any) -> None:
    # Must return within Celery's 4 s limit: the job row is written by the heartbeat thread.
    context = _current()
    if context is not None:
        # A pool process: its death is its parent's to judge first (sweeps/parents.py).
        node_name = str(sender) if sender else _node_name
        _start_worker_job(context, node_name, parent_pid=os.getppid())


@never_raises
def on_process_shutdown(**_: Any) -> None:
    # Multiprocess metrics: this child's live gauges stop counting (not sent on SIGKILL).
    metrics.mark_process_dead()
    context = _current()
    if context is not None:
        context.runtime.stop_job(JobState.SUCCESS)


@never_raises
def on_worker_ready(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    context = context_for_app(app) if app is not None else _current()
    pool = getattr(sender, "pool", None)
    if context is None:
        return
    in_children = _runs_tasks_in_children(pool)
    metrics.serve_for_worker(context.settings, in_children)
    node_name = getattr(sender, "hostname", None)
    # The main process takes the messages: its heartbeat carries its consumer's state.
    consumer = start_watch(context, sender).snapshot
    if in_children:
        # Only reserves messages (and writes when a pool process dies): the pool
        # children beat (and sweep when beat is down).  Starting the job also
        # connects to the store now, not when the first write is due.
        context.runtime.writer.flush_interval = MAIN_PROCESS_FLUSH_INTERVAL
        context.runtime.start_job(JobType.WORKER, node_name=node_name, consumer=consumer)
    else:
        _start_worker_job(context, node_name, consumer=consumer)


@never_raises
def on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    context = context_for_app(app) if app is not None else _current()
    stop_watch()
    if context is not None and context.runtime.job_id is not None:
        context.runtime.stop_job(JobState.SUCCESS)
    stop_holder()


@never_raises
def on_beat_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    context = context_for_app(app) if app is not None else _current()
    if context is not None:
        context.runtime.start_job(JobType.BEAT)
        if _schedules_sweeps(context, sender):
            # This beat sends the sweeps: it also watches the markers between them, so a
            # death is swept within a second rather than at the next scheduled sweep.
            start_marker_watch(context)


def _schedules_sweeps(context: RecoveryContext, service: Any) -> bool:
    """Whether the app's ``beat_schedule``, or the entries of the beat's own scheduler
    (django-celery-beat's models, with its scheduler or ours), send the sweep."""
    schedule = context.app.conf.beat_schedule or {}
    if any(
        isinstance(entry, dict) and entry.get("task") == SWEEP_TASK for entry in schedule.values()
    ):
        return True
    try:
        # Celery's Service made its scheduler before sending beat_init, in this thread.
        entries = service.scheduler.schedule.values()
    except Exception:  # no scheduler to ask (an embedded beat's sender, a broken schedule)
        return False
    return any(getattr(entry, "task", None) == SWEEP_TASK for entry in entries)


def _start_worker_job(
    context: RecoveryContext,
    node_name: str | None,
    parent_pid: int | None = None,
    consumer: Callable[[], dict[str, Any]] | None = None,
) -> None:
    duty = context.worker_beat_duty
    holder = f"{node_name}:{os.getpid()}"
    context.runtime.start_job(
        JobType.WORKER,
        node_name=node_name,
        on_beat=duty(holder) if duty else None,
        parent_pid=parent_pid,
        consumer=consumer,
    )


def _runs_tasks_in_children(pool: Any) -> bool:
    return type(pool).__module__ == "celery.concurrency.prefork"


def connect() -> None:
    worker_init.connect(on_worker_init, weak=False, dispatch_uid=__name__ + ".worker_init")
    worker_process_init.connect(on_process_init, weak=False, dispatch_uid=__name__ + ".init")
    worker_process_shutdown.connect(
        on_process_shutdown, weak=False, dispatch_uid=__name__ + ".shutdown"
    )
    worker_ready.connect(on_worker_ready, weak=False, dispatch_uid=__name__ + ".ready")
    worker_shutdown.connect(
        on_worker_shutdown, weak=False, dispatch_uid=__name__ + ".worker_shutdown"
    )
    beat_init.connect(on_beat_init, weak=False, dispatch_uid=__name__ + ".beat")
    beat_embedded_init.connect(on_beat_init, weak=False, dispatch_uid=__name__ + ".beat_embedded")
