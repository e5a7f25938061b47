"""The ``recovery_*`` settings: definitions, defaults, parsing and validation.

Settings are read once per app from ``app.conf``; an environment variable
``CELERY_RECOVERY_<NAME>`` overrides the app's value, and keyword arguments to
:class:`~celery_recovery.Recovery` override both.  Each definition carries its
own documentation so the configuration reference can be generated from it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from celery_recovery.core.durations import positive_seconds
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.presets import PRESETS
from celery_recovery.core.urls import mask_secrets, mask_url, normalise_database_url

PREFIX = "recovery_"
ENV_PREFIX = "CELERY_RECOVERY_"

#: Embedded store used when no URL is configured: a file in the working directory.
DEFAULT_DATABASE_URL = "sqlite:///celery_recovery.sqlite3"
#: Seconds between two heartbeats of a participating process.
DEFAULT_HEARTBEAT_INTERVAL = 5.0
#: Heartbeat age, in seconds, after which a running task's worker counts as dead.
DEFAULT_ZOMBIE_THRESHOLD = 30.0
#: Heartbeat age, in seconds, after which a beat or triggerer counts as dead.
DEFAULT_HEALTH_CHECK_THRESHOLD = 30.0
#: Seconds between two sweeps run by beat.
DEFAULT_SWEEP_INTERVAL = 5.0
#: Age, in seconds, at which a queued task no worker has started counts as lost.
DEFAULT_QUEUED_TIMEOUT = 600.0
#: Seconds an adopted task that the backend reports PENDING may stay unstarted.
DEFAULT_ADOPTION_TIMEOUT = 600.0

#: Seconds a worker's consumer may go without taking a message while it has free
#: slots and its queues hold ready ones (or its broker connection is down) before
#: the worker counts as stalled.
DEFAULT_STALLED_CONSUMER_TIMEOUT = 60.0
#: What a stalled worker does besides reporting it.
DEFAULT_ON_STALLED_CONSUMER = "report"
#: The values of recovery_on_stalled_consumer.
ON_STALLED_CONSUMER_ACTIONS = ("report", "exit")

#: How many times its task's usual duration a running try may take before it is overdue.
DEFAULT_OVERDUE_FACTOR = 3.0
#: Successful runs a task needs on record before any of its tries can be overdue.
DEFAULT_OVERDUE_MIN_RUNS = 20
#: Seconds a try runs, at least, before it can be overdue, however quick its task usually is.
DEFAULT_OVERDUE_MIN_SECONDS = 60.0

#: Times a lost message is published again before its task is failed.
DEFAULT_MAX_REPUBLISH = 3
#: Runs of one try that may end with the death of their process, for a task whose
#: ``max_retries`` is None: as many as Celery's default ``max_retries`` (3) allows.
DEFAULT_MAX_LOST_RUNS = 4
#: Seconds one failure callback or listener may run before the sweep moves on.
DEFAULT_CALLBACK_TIMEOUT = 30.0
#: Triggers one triggerer process runs at once.
DEFAULT_TRIGGERER_CAPACITY = 1000
#: What a sweep does with a dead worker's running try when nothing can tell whether it
#: finished (no result backend, ``rpc://``, or a task that stores no result).
DEFAULT_UNKNOWN_OUTCOME = "rerun"
#: The values of recovery_unknown_outcome (and of the task attribute of that name).
UNKNOWN_OUTCOME_ACTIONS = ("rerun", "fail")
#: How the store learns whether a transaction-mode pooler (PgBouncer) stands in front.
DEFAULT_DATABASE_POOLER = "auto"
#: The values of recovery_database_pooler.
DATABASE_POOLER_MODES = ("auto", "none", "transaction")
#: Timing preset whose values are the defaults of the timing settings.
DEFAULT_PRESET = "default"
#: Which liveness markers processes hold and sweeps check.
DEFAULT_LIVENESS_MARKERS = "auto"
#: The values of recovery_liveness_markers.
LIVENESS_MARKER_MODES = ("auto", "process", "off")
#: Seconds a missed beat run may be late and still be sent (``catch_up`` "latest"/"all").
DEFAULT_BEAT_CATCH_UP_WINDOW = 86400.0
#: Where celery_recovery.beat:Scheduler takes its entries from.
DEFAULT_BEAT_ENTRIES = "beat_schedule"
#: The values of recovery_beat_entries.
BEAT_ENTRY_SOURCES = ("beat_schedule", "django")
#: Port on which sweep and triggerer processes serve Prometheus metrics; None serves nothing.
DEFAULT_METRICS_PORT: int | None = None
#: Whether a worker runs the doctor once at start and logs what it finds.
DEFAULT_DOCTOR_AT_START = True
#: Longest countdown or ETA the app publishes with, in seconds; None: not declared.
DEFAULT_LONGEST_ETA: float | None = None

#: A zombie threshold must cover at least this many heartbeat intervals, or one
#: late heartbeat (a GC pause, a slow commit) would declare a live worker dead.
MIN_HEARTBEATS_PER_THRESHOLD = 3


@dataclass(frozen=True)
class SettingSpec:
    """How one setting is named, parsed and documented."""

    name: str
    default: Any
    parse: Callable[[str, Any], Any]
    doc: str
    unit: str = ""

    @property
    def conf_key(self) -> str:
        return PREFIX + self.name

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _duration(key: str, value: Any) -> float:
    """Seconds: a positive, finite number (a numeric string in the environment) or a
    ``timedelta``."""
    return positive_seconds(key, value, timedelta_ok=True, text_ok=True)


def _count(key: str, value: Any) -> int:
    """Whole number: an integer >= 0 (a string of digits in the environment)."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{key}={value!r} must be a whole number >= 0")
    try:
        result = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{key}={value!r} must be a whole number >= 0") from None
    if result < 0 or (isinstance(value, float) and value != result):
        raise ConfigurationError(f"{key}={value!r} must be a whole number >= 0")
    return result


def _positive_count(key: str, value: Any) -> int:
    """Whole number: an integer >= 1 (a string of digits in the environment)."""
    result = _count(key, value)
    if result < 1:
        raise ConfigurationError(f"{key}={value!r} must be a whole number >= 1")
    return result


def _factor(key: str, value: Any) -> float:
    """Factor: a finite number of at least 1 (a numeric string in the environment)."""
    problem = f"{key}={value!r} must be a number of at least 1, e.g. 3"
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigurationError(problem) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(problem)
    if not (value >= 1 and value != float("inf")):
        raise ConfigurationError(problem)
    return float(value)


def _module_prefixes(key: str, value: Any) -> tuple[str, ...] | None:
    """Module names: a list of dotted module names, or one comma-separated string;
    unset means the default."""
    if value is None or value == "":
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset):
        raise ConfigurationError(
            f"{key}={value!r} must be a list of module names (or one comma-separated string)"
        )
    prefixes = []
    for item in items:
        name = item.strip() if isinstance(item, str) else None
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise ConfigurationError(
                f"{key} item {item!r} is not a module name like 'myapp.triggers'"
            )
        prefixes.append(name)
    return tuple(prefixes)


def _patterns(key: str, value: Any) -> tuple[str, ...]:
    """Glob patterns (``fnmatch``: ``*``, ``?``, ``[...]``): a list, or one
    comma-separated string; unset means none."""
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset):
        raise ConfigurationError(
            f"{key}={value!r} must be a list of glob patterns (or one comma-separated string), "
            "e.g. ['metrics.*', 'cache.refresh']"
        )
    patterns = []
    for item in items:
        pattern = item.strip() if isinstance(item, str) else None
        if not pattern:
            raise ConfigurationError(
                f"{key} item {item!r} is not a glob pattern: a non-empty string like 'metrics.*'"
            )
        patterns.append(pattern)
    return tuple(patterns)


def _port(key: str, value: Any) -> int | None:
    """TCP port: an integer from 1 to 65535; unset or ``None`` serves nothing."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    problem = f"{key}={value!r} must be a TCP port number from 1 to 65535, or None to serve nothing"
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ConfigurationError(problem)
    try:
        port = int(value.strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(problem) from None
    if not 1 <= port <= 65535:
        raise ConfigurationError(problem)
    return port


def _optional_duration(key: str, value: Any) -> float | None:
    """Seconds: a positive, finite number (a numeric string in the environment) or a
    ``timedelta``; unset or ``None`` means not declared."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    return _duration(key, value)


#: How the environment spells the two values of a flag.
_FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True}
_FLAG_WORDS.update({"0": False, "false": False, "no": False, "off": False})


def _flag(key: str, value: Any) -> bool:
    """Flag: ``True`` or ``False`` (``1``/``0``, ``true``/``false``, ``yes``/``no``,
    ``on``/``off`` in the environment)."""
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if word not in _FLAG_WORDS:
        raise ConfigurationError(
            f"{key}={value!r} must be True or False (in the environment: 1/0, true/false, "
            "yes/no, on/off)"
        )
    return _FLAG_WORDS[word]


def _preset(key: str, value: Any) -> str:
    """Preset name: one of the presets in :data:`celery_recovery.beat_schedules.PRESETS`."""
    if not isinstance(value, str) or value not in PRESETS:
        allowed = ", ".join(repr(p) for p in PRESETS)
        raise ConfigurationError(f"{key}={value!r} is not a preset; allowed: {allowed}")
    return str(value)


def _one_of(key: str, value: Any, choices: tuple[str, ...], what: str) -> str:
    """``value`` as one of ``choices`` (any case, spaces around ignored), or an error."""
    choice = value.strip().lower() if isinstance(value, str) else value
    if choice not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ConfigurationError(f"{key}={value!r} is not {what}; allowed: {allowed}")
    return str(choice)


def _liveness_markers(key: str, value: Any) -> str:
    """Marker mode: ``auto``, ``process`` or ``off``."""
    return _one_of(key, value, LIVENESS_MARKER_MODES, "a marker mode")


def _on_stalled(key: str, value: Any) -> str:
    """Action: ``report`` or ``exit``."""
    return _one_of(key, value, ON_STALLED_CONSUMER_ACTIONS, "an action")


def _database_pooler(key: str, value: Any) -> str:
    """Pooler mode: ``auto``, ``none`` or ``transaction``."""
    return _one_of(key, value, DATABASE_POOLER_MODES, "a pooler mode")


def _beat_entries(key: str, value: Any) -> str:
    """Source: ``beat_schedule`` or ``django``."""
    return _one_of(key, value, BEAT_ENTRY_SOURCES, "a source of beat entries")


def unknown_outcome(key: str, value: Any) -> str:
    """Action: ``rerun`` or ``fail``."""
    return _one_of(key, value, UNKNOWN_OUTCOME_ACTIONS, "an action")


def _database_url(key: str, value: Any) -> str:
    """Database URL: ``sqlite:///<file>`` (a file, not ``:memory:``) or
    ``postgresql+psycopg://user:password@host/dbname`` (``postgresql://`` and
    ``postgres://`` are pinned to psycopg 3)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"{key}={value!r} must be a database URL string, e.g. "
            "'postgresql+psycopg://user@host/dbname' or 'sqlite:///celery_recovery.sqlite3'"
        )
    return normalise_database_url(value.strip(), key).render_as_string(hide_password=False)


def _redis_url(key: str, value: Any) -> str | None:
    """Redis URL: ``redis://``, ``rediss://`` or ``unix://``; unset or empty means the
    broker URL when the broker is Redis, else none."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigurationError(
            f"{key}={mask_url(str(value))!r} must be a Redis URL "
            "(redis://, rediss:// or unix://), or unset to use the broker URL when it is Redis"
        )
    from redis.connection import parse_url

    try:
        parse_url(value)
    except ValueError as exc:
        # A bad port or db number would otherwise surface as a traceback at first use.
        raise ConfigurationError(
            f"{key}={mask_url(value)!r} is not a valid Redis URL: {mask_secrets(str(exc))}"
        ) from None
    return value


#: Shortest ``recovery_web_token`` accepted: long enough that guessing it is hopeless.
MIN_WEB_TOKEN_LENGTH = 16


def _web_token(key: str, value: Any) -> str | None:
    """Secret: a string of at least 16 characters; unset or empty means none."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value.strip()) < MIN_WEB_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{key} must be a string of at least {MIN_WEB_TOKEN_LENGTH} characters "
            "(e.g. from `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
        )
    return value.strip()


def _web_credentials(key: str, value: Any) -> str | None:
    """Secret: ``user:password``, both parts non-empty; unset or empty means none."""
    if value is None or value == "":
        return None
    user, colon, password = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not (user and colon and password):
        raise ConfigurationError(f"{key} must be 'user:password' with both parts non-empty")
    return value


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec(
        "preset",
        DEFAULT_PRESET,
        _preset,
        "Timing preset whose values are the defaults of the timing settings (heartbeat "
        "interval, thresholds, sweep interval, queued and adoption timeouts); a setting given "
        "explicitly overrides its preset value. Beat's sweep schedule is set separately: pass "
        "the same preset to `recovery_beat_schedule(preset)`.",
    ),
    SettingSpec(
        "database_url",
        DEFAULT_DATABASE_URL,
        _database_url,
        "Metadata store for jobs, tries, failure callbacks and leases. The default SQLite "
        "file (relative to the working directory; its tables are created automatically) "
        "suits one machine. Use PostgreSQL when processes run on several hosts, and create "
        "its tables with `celery-recovery db upgrade` before starting workers.",
    ),
    SettingSpec(
        "redis_url",
        None,
        _redis_url,
        "Redis for `@recoverable` idempotency locks, fencing tokens and remembered results. "
        "Defaults to the broker URL when the broker is Redis; with another broker, "
        "`@recoverable` tasks need it set. Unused when no task is `@recoverable`.",
    ),
    SettingSpec(
        "database_pooler",
        DEFAULT_DATABASE_POOLER,
        _database_pooler,
        "Whether the PostgreSQL store is reached through a pooler in transaction mode "
        "(PgBouncer, Odyssey, PgCat, Supavisor, RDS Proxy), which gives each transaction "
        "another server session: `auto` finds out once per process tree (a pooler answers "
        "the connection with a backend process id of its own making), `transaction` says "
        "there is one, `none` that there is none. Behind one, no session state is relied "
        "on: timeouts are set per transaction (`SET LOCAL`) instead of as startup options, "
        "psycopg prepares no statement on the server, and processes hold no advisory-lock "
        "liveness marker (the process marker is used). See "
        "docs/tuning.md#connections-and-poolers.",
    ),
    SettingSpec(
        "heartbeat_interval",
        DEFAULT_HEARTBEAT_INTERVAL,
        _duration,
        "How often each worker process, beat and triggerer refreshes its job heartbeat "
        "(one row write per process per interval, whatever the number of tasks).",
        "s",
    ),
    SettingSpec(
        "zombie_threshold",
        DEFAULT_ZOMBIE_THRESHOLD,
        _duration,
        "Heartbeat age after which a worker process counts as dead and its running tries "
        "as zombies, to be retried or failed. Lower reacts faster to a killed worker; higher "
        "tolerates longer pauses (GC, swapping, a slow store) without false alarms. At least "
        f"{MIN_HEARTBEATS_PER_THRESHOLD} heartbeat intervals.",
        "s",
    ),
    SettingSpec(
        "health_check_threshold",
        DEFAULT_HEALTH_CHECK_THRESHOLD,
        _duration,
        "Heartbeat age after which a beat or triggerer counts as dead: its job is marked "
        "failed and a warning is logged. At least "
        f"{MIN_HEARTBEATS_PER_THRESHOLD} heartbeat intervals.",
        "s",
    ),
    SettingSpec(
        "sweep_interval",
        DEFAULT_SWEEP_INTERVAL,
        _duration,
        "How often `celery-recovery sweep --loop` and the workers' fallback sweep run; when "
        "no sweep has finished for 3 intervals, live workers sweep themselves. Beat's schedule "
        "does not read it: give `recovery_beat_schedule(preset, sweep_interval)` the same "
        "value. At most the zombie threshold.",
        "s",
    ),
    SettingSpec(
        "queued_timeout",
        DEFAULT_QUEUED_TIMEOUT,
        _duration,
        "Age at which a queued try that no worker has started counts as lost (counted from "
        "its ETA when it has one) and is published again. Keep it above the longest "
        "time a task may wait in a queue. A delivery published longer ago than half of it "
        "is checked against the store before it runs (redundant-delivery check).",
        "s",
    ),
    SettingSpec(
        "adoption_timeout",
        DEFAULT_ADOPTION_TIMEOUT,
        _duration,
        "How long a zombie adopted by a live worker (the result backend says STARTED there) "
        "may go without that worker's own claim before it is reset.",
        "s",
    ),
    SettingSpec(
        "stalled_consumer_timeout",
        DEFAULT_STALLED_CONSUMER_TIMEOUT,
        _duration,
        "How long a worker may go without receiving a message, while it has free slots and "
        "its queues hold ready messages (or its broker connection is down or the broker does "
        "not answer), before it counts as stalled: `jobs check` fails for it, it logs a "
        "warning, writes an audit row and counts a metric. Its main process asks the broker "
        "for its queues' ready messages only when idle, four times per timeout. An idle "
        "worker with empty queues is never stalled. At least "
        f"{MIN_HEARTBEATS_PER_THRESHOLD} heartbeat intervals. See docs/stuck.md.",
        "s",
    ),
    SettingSpec(
        "on_stalled_consumer",
        DEFAULT_ON_STALLED_CONSUMER,
        _on_stalled,
        "What a stalled worker does besides reporting it: `report` (nothing more: the "
        "liveness probe `jobs check` fails, and the orchestrator restarts it) or `exit` (it "
        "shuts itself down warm, as on SIGTERM, so that its supervisor starts it again; "
        "running tasks finish or are recovered as usual).",
    ),
    SettingSpec(
        "overdue_factor",
        DEFAULT_OVERDUE_FACTOR,
        _factor,
        "A running try is overdue once it has run this many times its task's usual "
        "duration (the 95th percentile of the task's last 200 successful runs), and at "
        "least `recovery_overdue_min_seconds`. Overdue tries are only shown (`inspect "
        "overdue`, the console, the `celery_recovery_overdue_tries` gauge), never acted on: "
        "they make a hang visible in a task without `recovery_heartbeat_timeout`. See "
        "docs/stuck.md.",
    ),
    SettingSpec(
        "overdue_min_runs",
        DEFAULT_OVERDUE_MIN_RUNS,
        _positive_count,
        "Successful runs of a task the store must hold before any of its tries can be "
        "overdue: with fewer, its usual duration is unknown.",
    ),
    SettingSpec(
        "overdue_min_seconds",
        DEFAULT_OVERDUE_MIN_SECONDS,
        _duration,
        "Shortest run after which a try can be overdue, however quick its task usually is.",
        "s",
    ),
    SettingSpec(
        "max_republish",
        DEFAULT_MAX_REPUBLISH,
        _count,
        "Times a lost message is published again before its task is failed as lost "
        "(0: fail it at once). Retries after a dead worker are bounded by the task's "
        "`max_retries` instead.",
    ),
    SettingSpec(
        "max_lost_runs",
        DEFAULT_MAX_LOST_RUNS,
        _positive_count,
        "Runs of one try that may each end with the death of their process (its message "
        "coming back, with `acks_late`) before the try is failed instead of run again, for "
        "a task whose `max_retries` is None (Celery's retry for ever). A task with a "
        "`max_retries` gets `max_retries + 1` runs in all, each death counting as a retry. "
        "See docs/failure-modes.md.",
    ),
    SettingSpec(
        "unknown_outcome",
        DEFAULT_UNKNOWN_OUTCOME,
        unknown_outcome,
        "What a sweep does with a dead worker's running try when nothing can tell whether "
        "it had finished: no result backend is configured, the backend is `rpc://` (which "
        "answers only the caller), or the task stores no result (`ignore_result`). `rerun` "
        "publishes it again, as the next try (at least once: a try that had finished just "
        "before its worker died, its outcome not yet in the store, runs a second time); "
        "`fail` fails it (`on_failure` and the failure listeners run), so it never runs "
        "twice but may not run at all. A task attribute of the same name "
        "(`@app.task(recovery_unknown_outcome='fail')`) overrides it for that task. A try "
        "that never started is published again either way. See docs/backends.md.",
    ),
    SettingSpec(
        "callback_timeout",
        DEFAULT_CALLBACK_TIMEOUT,
        _duration,
        "How long one failure callback (`on_failure`, `on_retry`, the `task_failure` signal "
        "or a failure listener) may run before the sweep moves on; it is left running in its "
        "thread. The claim on a callback row lasts 4 times this plus 10 s.",
        "s",
    ),
    SettingSpec(
        "triggerer_capacity",
        DEFAULT_TRIGGERER_CAPACITY,
        _positive_count,
        "Most triggers one triggerer process runs at once (its `--capacity` overrides it).",
    ),
    SettingSpec(
        "trigger_allowed_modules",
        None,
        _module_prefixes,
        "Modules (and their submodules) a triggerer may import trigger classes from. Unset: "
        "`celery_recovery` and the top-level packages of the app's own tasks. A class path "
        "stored in the database outside these is refused, never imported.",
    ),
    SettingSpec(
        "liveness_markers",
        DEFAULT_LIVENESS_MARKERS,
        _liveness_markers,
        "Markers that let a sweep find a dead process without waiting for the zombie "
        "threshold: a process whose marker is gone and whose heartbeat is late by more than "
        "one interval (two for the lock) is dead at once; one whose marker is present is "
        "judged by the threshold. "
        "`auto`: a PostgreSQL advisory lock on a connection of its own (one per worker, beat "
        "and triggerer, when the store is PostgreSQL) and the process id with its start time "
        "(checked by a sweep on the same host). `process`: the second only. Behind a "
        "transaction-mode pooler (see `recovery_database_pooler`) `auto` holds no lock: a "
        "session lock cannot be held there. `off`: heartbeats alone. See "
        "docs/failure-modes.md.",
    ),
    SettingSpec(
        "beat_catch_up_window",
        DEFAULT_BEAT_CATCH_UP_WINDOW,
        _duration,
        "With `celery_recovery.beat:Scheduler`: how late a scheduled run no beat sent in time "
        "(every beat down, or no leader yet) may be and still be sent, under the entry's "
        "catch-up policy (`latest`, the default: the newest missed run once; `all`: each one). "
        "An entry's `options={'recovery': {'catch_up_window': ...}}` overrides it. "
        "See docs/beat.md.",
        "s",
    ),
    SettingSpec(
        "beat_entries",
        DEFAULT_BEAT_ENTRIES,
        _beat_entries,
        "With `celery_recovery.beat:Scheduler`: where its entries come from. `beat_schedule`: "
        "the app's `beat_schedule`, read at start. `django`: django-celery-beat's models "
        "(`PeriodicTask` and its schedules, as edited in the Django admin; changes are picked "
        "up within seconds), after the app's `beat_schedule` is written into them as "
        "django-celery-beat's `DatabaseScheduler` does. A Django project sets "
        '`CELERY_RECOVERY_BEAT_ENTRIES = "django"`. See docs/beat.md.',
    ),
    SettingSpec(
        "metrics_port",
        DEFAULT_METRICS_PORT,
        _port,
        "TCP port on which Prometheus metrics are served at `/metrics` by the processes that "
        "read it: `celery-recovery sweep --loop` (its `--metrics-port` overrides it), the "
        "triggerer, and a worker's main process when `PROMETHEUS_MULTIPROC_DIR` is set (or "
        "its pool runs tasks in the main process). Unset: nothing listens. See docs/metrics.md.",
    ),
    SettingSpec(
        "exclude_tasks",
        (),
        _patterns,
        "Task names (glob patterns, e.g. `metrics.*`) celery-recovery leaves alone: such a "
        "task records nothing when published or run, costs nothing beyond one cached name "
        "look-up, and is never recovered (a killed or lost one is gone, as with plain "
        "Celery). For trivial high-rate tasks; see docs/tuning.md.",
    ),
    SettingSpec(
        "exclude_queues",
        (),
        _patterns,
        "Queues (glob patterns, matched against the message's routing key: the queue's name "
        "with Celery's default routing) whose tasks celery-recovery leaves alone, as "
        "`recovery_exclude_tasks` does. Each message pays one cached look-up of its routing "
        "key while this is set.",
    ),
    SettingSpec(
        "doctor_at_start",
        DEFAULT_DOCTOR_AT_START,
        _flag,
        "Whether a worker runs `celery-recovery doctor`'s checks once when it is ready, in a "
        "thread of its main process (never delaying or breaking the worker), and logs each "
        "finding as a warning. See docs/doctor.md.",
    ),
    SettingSpec(
        "longest_eta",
        DEFAULT_LONGEST_ETA,
        _optional_duration,
        "Longest countdown or ETA (how far ahead) the app's tasks are published with. A "
        "worker holds such a message unacknowledged until it is due, so the doctor compares "
        "it with the broker's visibility timeout (Redis, SQS) and RabbitMQ's consumer "
        "timeout. Unset: the doctor uses the farthest ETA of the queued tries in the store.",
        "s",
    ),
    SettingSpec(
        "web_token",
        None,
        _web_token,
        "Bearer token the console (`celery-recovery web`) requires of every request "
        "(`Authorization: Bearer TOKEN`, or `?token=TOKEN` once, which sets a cookie). "
        "Unset: no token. The console refuses to serve on an interface other than the "
        "loopback without this or `recovery_web_credentials`. See docs/console.md.",
    ),
    SettingSpec(
        "web_credentials",
        None,
        _web_credentials,
        "`user:password` the console requires with HTTP basic authentication. Unset: none. "
        "Prefer the environment variable, so the password stays out of code.",
    ),
)

_SPECS = {spec.name: spec for spec in SETTINGS}


@dataclass(frozen=True)
class RecoverySettings:
    """The validated settings of one app. Durations are in seconds."""

    database_url: str = field(default=DEFAULT_DATABASE_URL, repr=False)
    redis_url: str | None = field(default=None, repr=False)
    database_pooler: str = DEFAULT_DATABASE_POOLER
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    zombie_threshold: float = DEFAULT_ZOMBIE_THRESHOLD
    health_check_threshold: float = DEFAULT_HEALTH_CHECK_THRESHOLD
    sweep_interval: float = DEFAULT_SWEEP_INTERVAL
    queued_timeout: float = DEFAULT_QUEUED_TIMEOUT
    adoption_timeout: float = DEFAULT_ADOPTION_TIMEOUT
    stalled_consumer_timeout: float = DEFAULT_STALLED_CONSUMER_TIMEOUT
    on_stalled_consumer: str = DEFAULT_ON_STALLED_CONSUMER
    overdue_factor: float = DEFAULT_OVERDUE_FACTOR
    overdue_min_runs: int = DEFAULT_OVERDUE_MIN_RUNS
    overdue_min_seconds: float = DEFAULT_OVERDUE_MIN_SECONDS
    max_republish: int = DEFAULT_MAX_REPUBLISH
    max_lost_runs: int = DEFAULT_MAX_LOST_RUNS
    unknown_outcome: str = DEFAULT_UNKNOWN_OUTCOME
    callback_timeout: float = DEFAULT_CALLBACK_TIMEOUT
    triggerer_capacity: int = DEFAULT_TRIGGERER_CAPACITY
    trigger_allowed_modules: tuple[str, ...] | None = None
    liveness_markers: str = DEFAULT_LIVENESS_MARKERS
    beat_catch_up_window: float = DEFAULT_BEAT_CATCH_UP_WINDOW
    beat_entries: str = DEFAULT_BEAT_ENTRIES
    metrics_port: int | None = DEFAULT_METRICS_PORT
    doctor_at_start: bool = DEFAULT_DOCTOR_AT_START
    longest_eta: float | None = DEFAULT_LONGEST_ETA
    exclude_tasks: tuple[str, ...] = ()
    exclude_queues: tuple[str, ...] = ()
    web_token: str | None = field(default=None, repr=False)
    web_credentials: str | None = field(default=None, repr=False)
    preset: str = DEFAULT_PRESET

    def __post_init__(self) -> None:
        _check_relations(self)

    @property
    def masked_database_url(self) -> str:
        return mask_url(self.database_url)

    @classmethod
    def from_sources(
        cls,
        conf: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        broker_url: str | None = None,
    ) -> RecoverySettings:
        """Build settings from an app's conf, the environment and explicit overrides.

        Later sources win: ``conf`` < ``environ`` < ``overrides``.  Unknown
        ``recovery_*`` names are refused with the nearest known name.
        """
        raw: dict[str, tuple[str, Any]] = {}
        for key, value in (conf or {}).items():
            lowered = key.lower()
            if lowered.startswith(PREFIX):
                raw[_known(lowered[len(PREFIX) :], key)] = (key, value)
        return cls._from_raw(raw, environ, overrides, broker_url)

    @classmethod
    def _from_raw(
        cls,
        raw: dict[str, tuple[str, Any]],
        environ: Mapping[str, str] | None,
        overrides: Mapping[str, Any] | None,
        broker_url: str | None,
    ) -> RecoverySettings:
        """``raw`` maps names to (key as written, value) from the app's conf."""
        return cls(**_values_from_raw(raw, environ, overrides, broker_url))

    @classmethod
    def from_app(cls, app: Any, **overrides: Any) -> RecoverySettings:
        """Settings of a Celery app (``app.conf``), the environment and ``overrides``.

        ``app.conf`` is read the way Celery reads its own settings: with
        ``config_from_object(obj, namespace="CELERY")`` the keys are
        ``CELERY_RECOVERY_*``.  A key that looks like ours but that the app's
        namespace does not read is warned about, and refused when it names
        another store than the one that would be used.
        """
        from celery_recovery.core.app_conf import read_app_conf, report_unread

        values = read_app_conf(app)
        settings = cls(**app_values(app, **overrides))
        report_unread(app, values, settings.database_url)
        return settings


def app_values(app: Any, **overrides: Any) -> dict[str, Any]:
    """Every setting of a Celery app, parsed, by name, as :meth:`RecoverySettings.from_app`
    reads them, before the relations between them are checked (see
    :func:`relation_problems`).  A value that cannot be parsed still raises."""
    from celery_recovery.core.app_conf import read_app_conf, spelling

    spell = spelling(app)
    raw = {
        _known(n, key, spell): (key, value) for n, (key, value) in read_app_conf(app).read.items()
    }
    return _values_from_raw(raw, None, overrides, app.conf.broker_url or "")


def _values_from_raw(
    raw: dict[str, tuple[str, Any]],
    environ: Mapping[str, str] | None,
    overrides: Mapping[str, Any] | None,
    broker_url: str | None,
) -> dict[str, Any]:
    raw = dict(raw)
    for key, value in (environ if environ is not None else os.environ).items():
        if key.startswith(ENV_PREFIX):
            raw[_known(key[len(ENV_PREFIX) :].lower(), key)] = (key, value)
    for key, value in (overrides or {}).items():
        name = _known(key[len(PREFIX) :] if key.startswith(PREFIX) else key, key)
        raw[name] = (_SPECS[name].conf_key, value)

    parsed = {name: _SPECS[name].parse(key, value) for name, (key, value) in raw.items()}
    values: dict[str, Any] = dict(PRESETS[parsed.get("preset", DEFAULT_PRESET)])
    values.update(parsed)
    if (
        values.get("redis_url") is None
        and broker_url
        and broker_url.startswith(("redis://", "rediss://"))
    ):
        values["redis_url"] = broker_url
    # Every setting, so that relation_problems() may read any of them.
    return {f.name: values.get(f.name, f.default) for f in fields(RecoverySettings)}


def _known(name: str, key: str, spell: Callable[[str], str] | None = None) -> str:
    """``name`` if it is a setting, else an error naming ``key`` and the nearest setting,
    written as ``spell(name)`` (the app's own spelling of our keys)."""
    if name in _SPECS:
        return name
    spell = spell or (lambda known: PREFIX + known)
    close = difflib.get_close_matches(name, list(_SPECS), n=1, cutoff=0.6)
    hint = f"; did you mean {spell(close[0])!r}?" if close else ""
    allowed = ", ".join(spell(spec.name) for spec in SETTINGS)
    raise ConfigurationError(f"unknown setting {key!r}{hint} (known settings: {allowed})")


def _check_relations(s: RecoverySettings) -> None:
    for f in fields(s):
        spec = _SPECS[f.name]
        value = getattr(s, f.name)
        if spec.parse is _duration or (spec.parse is _optional_duration and value is not None):
            _duration(spec.conf_key, value)
    problems = relation_problems({f.name: getattr(s, f.name) for f in fields(s)})
    if problems:
        raise ConfigurationError(problems[0][1])


def relation_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every way the timing ``values`` (parsed, by setting name) misjudge a pause or a
    death, as (setting key, message naming it and why); empty when they are sound.

    :class:`RecoverySettings` refuses the first; ``celery-recovery doctor`` reports all.
    """
    found: list[tuple[str, str]] = []
    heartbeat = values["heartbeat_interval"]
    floor = MIN_HEARTBEATS_PER_THRESHOLD * heartbeat
    for name in ("zombie_threshold", "health_check_threshold"):
        value = values[name]
        if value < floor:
            found.append(
                (
                    PREFIX + name,
                    f"{PREFIX}{name}={value:g}s is shorter than {MIN_HEARTBEATS_PER_THRESHOLD} "
                    f"heartbeat intervals ({PREFIX}heartbeat_interval={heartbeat:g}s, "
                    f"so at least {floor:g}s): one late heartbeat would declare a live process "
                    "dead",
                )
            )
    stalled = values.get("stalled_consumer_timeout")
    if stalled is not None and stalled < floor:
        found.append(
            (
                PREFIX + "stalled_consumer_timeout",
                f"{PREFIX}stalled_consumer_timeout={stalled:g}s is shorter than "
                f"{MIN_HEARTBEATS_PER_THRESHOLD} heartbeat intervals ({PREFIX}heartbeat_interval="
                f"{heartbeat:g}s, so at least {floor:g}s): a worker samples its consumer once an "
                "interval and needs several samples to judge it",
            )
        )
    sweep = values["sweep_interval"]
    for name, what in (
        ("zombie_threshold", "zombies"),
        ("health_check_threshold", "dead beats and triggerers, and their orphaned triggers,"),
    ):
        threshold = values[name]
        if sweep > threshold:
            found.append(
                (
                    PREFIX + "sweep_interval",
                    f"{PREFIX}sweep_interval={sweep:g}s is longer than "
                    f"{PREFIX}{name}={threshold:g}s: {what} would wait longer than the "
                    "threshold promises; use a sweep interval at most the threshold",
                )
            )
    return found
