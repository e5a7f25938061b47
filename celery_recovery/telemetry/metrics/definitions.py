"""Every Prometheus metric celery-recovery exports, in the client's default registry.

Names follow Prometheus conventions: the ``celery_recovery_`` prefix,
``_total`` on counters, base units (``_seconds``).  Labels take a small,
fixed set of values, all created up front so that each series exists (at
0) from the start and ``rate()`` and alerts see it before its first event.

Gauges say how prometheus-client's multiprocess mode (prefork workers with
``PROMETHEUS_MULTIPROC_DIR``) combines the values of several processes:
``mostrecent`` for values a sweep computes from the store (whichever
process swept last is right), ``livesum`` for what each live process holds.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from celery_recovery.core.records import SweepOutcome
from celery_recovery.core.states import JobType

PREFIX = "celery_recovery_"

#: Which check of a sweep found a try: running on a dead worker, reserved (received,
#: not started) by a dead worker, or queued past recovery_queued_timeout.
CAUSES = ("zombie", "reserved", "lost_message")
#: What a sweep did to a try it won: published it again as the next try, failed
#: it, re-pointed it to the live worker running it, or gave it the outcome the
#: result backend reports.
ACTIONS = (
    SweepOutcome.REPUBLISHED,
    SweepOutcome.FAILED,
    SweepOutcome.ADOPTED,
    SweepOutcome.RECONCILED,
    SweepOutcome.PARTITIONED,
)
CALLBACK_KINDS = ("failure", "retry")
#: ``abandoned``: given up after too many deliveries that died midway.
CALLBACK_OUTCOMES = ("delivered", "failed", "abandoned")
STORE_ERRORS = ("unavailable", "schema", "other")
#: ``acquired`` ran the body; ``held`` (another attempt holds the key) and ``done``
#: (the key completed before) did not; ``error``: Redis could not be asked.
LOCK_OUTCOMES = ("acquired", "held", "done", "error")
JOB_TYPES = tuple(t.value for t in JobType)
#: Who found a death by its marker, and which marker showed it.
MARKER_FINDERS = ("watch", "sweep")
MARKERS = ("process", "lock")
#: What a leading beat did with a scheduled run: ``sent`` on time, ``late`` (sent
#: after runs were missed), ``missed`` (never sent, under the entry's catch-up policy),
#: ``resent`` (claimed by another leader, sent again) or ``confirmed`` (claimed by
#: another leader, found sent).
#: How a beat's lead changed (``beat_lead_changes_total``).
BEAT_LEAD_CHANGES_KINDS = ("taken", "lost")
BEAT_RUN_OUTCOMES = ("sent", "late", "missed", "resent", "confirmed")
#: Outcomes of a trigger, as the triggerer reports them.
TRIGGER_EVENT_KINDS = ("resumed", "succeeded", "failed", "timed_out", "error")

# -- sweeps -------------------------------------------------------------------

SWEEP_DURATION = Histogram(
    PREFIX + "sweep_duration_seconds",
    "Duration of one recovery sweep pass (all steps); its _count is the number of sweeps.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LAST_SWEEP = Gauge(
    PREFIX + "last_sweep_timestamp_seconds",
    "Unix time at which a sweep pass in this process (or, multiprocess, any) last finished.",
    multiprocess_mode="max",
)
#: The sweep's steps (sweeps/runner.py STEPS), and "other" for its own bookkeeping.
SWEEP_STEPS = (
    "dead processes",
    "zombies",
    "reserved",
    "lost messages",
    "retries never sent",
    "dead jobs",
    "deferred tasks",
    "callbacks",
    "other",
)
LAST_CLEAN_SWEEP = Gauge(
    PREFIX + "last_clean_sweep_timestamp_seconds",
    "Unix time at which a sweep pass with no failing step last finished here: a sweeper "
    "whose passes all fail a step (last_sweep recent, this one old) recovers nothing.",
    multiprocess_mode="max",
)
SWEEP_STEP_FAILURES = Counter(
    PREFIX + "sweep_step_failures_total",
    "Sweep passes in which a step failed, by step (zombies, reserved, lost messages, "
    "dead jobs, callbacks, ...): the same step failing on every pass is a sweeper that "
    "cannot recover, and its log says why.",
    ["step"],
)
ZOMBIES_FOUND = Counter(
    PREFIX + "zombies_found_total",
    "Running tries found whose worker stopped heartbeating (counted by each sweep that "
    "finds one, so a try a sweep could not decide on yet is counted again next pass).",
)
LOST_MESSAGES = Counter(
    PREFIX + "lost_messages_total",
    "Queued tries no worker started within recovery_queued_timeout while the result "
    "backend knows nothing of them.",
)
SWEEP_ACTIONS = Counter(
    PREFIX + "sweep_actions_total",
    "Tries a sweep changed, by the check that found them (cause) and what it did (action). "
    "Each change is a compare-and-set won by one sweep, so concurrent sweeps count it once.",
    ["cause", "action"],
)
RACES_LOST = Counter(
    PREFIX + "sweep_races_lost_total",
    "Changes a sweep gave up because the try changed meanwhile (another sweep, or the "
    "worker itself); normal when several sweeps run.",
)
SWEEP_ERRORS = Counter(
    PREFIX + "sweep_errors_total",
    "Items or steps of a sweep that failed and were skipped until the next pass "
    "(store or result backend unreachable, a bad row).",
)
DEAD_JOBS = Counter(
    PREFIX + "dead_jobs_total",
    "Jobs (worker processes, beats, triggerers) marked failed as dead: their liveness "
    "marker gone (the marker watch, a sweep) or their heartbeat stopped (a sweep).",
    ["job_type"],
)
MARKER_DEATHS = Counter(
    PREFIX + "marker_deaths_total",
    "Jobs found dead by a liveness marker (their process gone, their advisory lock gone), "
    "by what found them: the marker watch (within a second) or a sweep's marker step.",
    ["found_by", "marker"],
)
CALLBACKS = Counter(
    PREFIX + "callbacks_total",
    "Failure callbacks (on_failure / on_retry and failure listeners) run by a sweep for "
    "tries it failed or retried, by kind and outcome.",
    ["kind", "outcome"],
)
CALLBACKS_PENDING = Gauge(
    PREFIX + "callbacks_pending",
    "Failure callbacks waiting in the outbox, as the last sweep counted them.",
    multiprocess_mode="mostrecent",
)
HEARTBEAT_AGE = Gauge(
    PREFIX + "heartbeat_age_seconds",
    "Age of the stalest heartbeat among running jobs of each type, as the last sweep saw "
    "it; NaN when none is running. Close to recovery_zombie_threshold means live "
    "processes are nearly taken for dead.",
    ["job_type"],
    multiprocess_mode="mostrecent",
)
OVERDUE_TRIES = Gauge(
    PREFIX + "overdue_tries",
    "Running tries far past their task's usual duration (recovery_overdue_factor times "
    "the 95th percentile of its recent successful runs), as the last sweep counted them. "
    "Nothing is done to them: above 0, look at `celery-recovery inspect overdue`.",
    multiprocess_mode="mostrecent",
)
JOBS_RUNNING = Gauge(
    PREFIX + "jobs_running",
    "Jobs of each type in state running, as the last sweep counted them (0 beats: beat is down).",
    ["job_type"],
    multiprocess_mode="mostrecent",
)

# -- every process: store and locks ---------------------------------------------

STORE_ERRORS_TOTAL = Counter(
    PREFIX + "store_errors_total",
    "Metadata store operations that failed (signal handlers, write-behind, heartbeats, "
    "sweeps), by kind of error.",
    ["error"],
)
DROPPED_WRITES = Counter(
    PREFIX + "dropped_writes_total",
    "Buffered task-record writes dropped because the store was down for too long.",
)
LOCK_ACQUISITIONS = Counter(
    PREFIX + "lock_acquisitions_total",
    "Idempotency-lock acquisitions by @recoverable tasks, by outcome (held = contention).",
    ["outcome"],
)
LEASES_LOST = Counter(
    PREFIX + "lock_leases_lost_total",
    "Idempotency-lock leases found no longer held at renewal or release (expired during a "
    "pause; a newer attempt may hold the key).",
)

# -- worker consumers --------------------------------------------------------------

STALLED_CONSUMERS = Counter(
    PREFIX + "stalled_consumers_total",
    "Times a worker found its consumer stalled: free slots and ready messages in its "
    "queues but nothing received, or its broker connection down or not answering, for "
    "recovery_stalled_consumer_timeout.",
)
CONSUMERS_STALLED = Gauge(
    PREFIX + "consumers_stalled",
    "Workers whose consumer is stalled now (1 per stalled worker main process).",
    multiprocess_mode="livesum",
)

# -- triggerer ------------------------------------------------------------------

TRIGGERS_RUNNING = Gauge(
    PREFIX + "triggers_running",
    "Triggers a triggerer is running now, per triggerer job id.",
    ["triggerer"],
    multiprocess_mode="livesum",
)
TRIGGER_EVENTS = Counter(
    PREFIX + "trigger_events_total",
    "Triggers that finished, by kind: resumed (task published to resume on a worker), "
    "succeeded / failed (task completed by the triggerer), timed_out, error.",
    ["kind"],
)
BLOCKED_LOOP = Counter(
    PREFIX + "triggerer_blocked_loop_warnings_total",
    "Times a triggerer's event loop was found blocked (a trigger doing blocking work).",
)


# -- beat -------------------------------------------------------------------------

BEAT_LEADING = Gauge(
    PREFIX + "beat_leading",
    "1 while this beat (celery_recovery.beat:Scheduler) holds the schedule's lease, else 0.",
    multiprocess_mode="livesum",
)
BEAT_LEAD_CHANGES = Counter(
    PREFIX + "beat_lead_changes_total",
    "Times this beat took the schedule's lead (a new fencing token) or lost it, by change.",
    ["change"],
)
BEAT_RUNS = Counter(
    PREFIX + "beat_runs_total",
    "Scheduled runs a leading beat decided, by outcome: sent, late, missed, resent, confirmed.",
    ["outcome"],
)


def _create_series() -> None:
    for cause in CAUSES:
        for action in ACTIONS:
            SWEEP_ACTIONS.labels(cause, action)
    for kind in CALLBACK_KINDS:
        for outcome in CALLBACK_OUTCOMES:
            CALLBACKS.labels(kind, outcome)
    for found_by in MARKER_FINDERS:
        for marker in MARKERS:
            MARKER_DEATHS.labels(found_by, marker)
    one_label = (
        (DEAD_JOBS, JOB_TYPES),
        (STORE_ERRORS_TOTAL, STORE_ERRORS),
        (LOCK_ACQUISITIONS, LOCK_OUTCOMES),
        (TRIGGER_EVENTS, TRIGGER_EVENT_KINDS),
        (BEAT_LEAD_CHANGES, BEAT_LEAD_CHANGES_KINDS),
        (BEAT_RUNS, BEAT_RUN_OUTCOMES),
    )
    for counter, values in one_label:
        for value in values:
            counter.labels(value)


_create_series()
