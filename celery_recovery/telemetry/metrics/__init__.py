"""Prometheus metrics: what the sweeps, locks, store and triggerer did, and serving them.

Every metric and its labels is in :mod:`.definitions`; docs/metrics.md
describes them for operators.  Recording is a counter increment or a gauge
set, never a store round trip per task, and never raises.
"""

from celery_recovery.telemetry.metrics.beat import beat_lead, beat_runs
from celery_recovery.telemetry.metrics.definitions import PREFIX
from celery_recovery.telemetry.metrics.record import (
    callback_outcome,
    consumer_stalled,
    dead_job,
    dropped_writes,
    lease_lost,
    lock_acquisition,
    marker_death,
    store_error,
    sweep_action,
    sweep_finished,
)
from celery_recovery.telemetry.metrics.serve import (
    MULTIPROC_ENV,
    MetricsServerError,
    mark_process_dead,
    multiprocess_dir,
    serve,
    serve_for_worker,
    stop,
)
from celery_recovery.telemetry.metrics.snapshot import refresh_gauges
from celery_recovery.telemetry.metrics.triggerer import (
    blocked_loop,
    trigger_event,
    triggerer_stopped,
    triggers_running,
)

__all__ = [
    "MULTIPROC_ENV",
    "PREFIX",
    "MetricsServerError",
    "beat_lead",
    "beat_runs",
    "blocked_loop",
    "callback_outcome",
    "consumer_stalled",
    "dead_job",
    "dropped_writes",
    "lease_lost",
    "lock_acquisition",
    "mark_process_dead",
    "marker_death",
    "multiprocess_dir",
    "refresh_gauges",
    "serve",
    "serve_for_worker",
    "stop",
    "store_error",
    "sweep_action",
    "sweep_finished",
    "trigger_event",
    "triggerer_stopped",
    "triggers_running",
]
