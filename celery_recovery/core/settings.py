"""The ``recovery_*`` settings: each declared once, with its default, parser and doc.

Settings are read once per app from ``app.conf``; an environment variable
``CELERY_RECOVERY_<NAME>`` overrides the app's value, and keyword arguments to
:class:`~celery_recovery.Recovery` override both.  Each field of
:class:`RecoverySettings` carries its own parser and documentation (see
:func:`setting`), so :data:`SETTINGS` and the configuration reference are derived
from the fields.  The timing settings take their defaults from the ``default``
preset, the one that applies when no other is chosen.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from celery_recovery.core import setting_parsers as parsers
from celery_recovery.core.app_conf import PREFIX, read_app_conf, report_unread, spelling
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.presets import DEFAULT_PRESET, PRESETS
from celery_recovery.core.timing_relations import MIN_HEARTBEATS_PER_THRESHOLD, relation_problems
from celery_recovery.core.urls import mask_url

ENV_PREFIX = "CELERY_RECOVERY_"

_TIMING = PRESETS[DEFAULT_PRESET]


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


def setting(
    default: Any,
    *,
    parse: Callable[[str, Any], Any],
    doc: str,
    unit: str = "",
    secret: bool = False,
) -> Any:
    """A field of :class:`RecoverySettings`: its ``default``, the parser of a value as
    given (``parse(key, value)``), its ``doc`` for the reference and the ``unit`` shown
    with its values there.  A ``secret`` one (it may hold a password) stays out of the
    settings' ``repr``."""
    return field(
        default=default, repr=not secret, metadata={"parse": parse, "doc": doc, "unit": unit}
    )


def seconds(default: float, *, doc: str) -> Any:
    """A duration field of :class:`RecoverySettings`: seconds, given as a number or a
    ``timedelta``."""
    return setting(default, parse=parsers.duration, doc=doc, unit="s")


@dataclass(frozen=True)
class RecoverySettings:
    """The validated settings of one app. Durations are in seconds."""

    preset: str = setting(
        DEFAULT_PRESET,
        parse=parsers.preset,
        doc="Timing preset whose values are the defaults of the timing settings (heartbeat "
        "interval, thresholds, sweep interval, queued and adoption timeouts); a setting given "
        "explicitly overrides its preset value. Beat's sweep schedule is set separately: pass "
        "the same preset to `recovery_beat_schedule(preset)`.",
    )
    database_url: str = setting(
        "sqlite:///celery_recovery.sqlite3",
        parse=parsers.database_url,
        doc="Metadata store for jobs, tries, failure callbacks and leases. The default SQLite "
        "file (relative to the working directory; its tables are created automatically) "
        "suits one machine. Use PostgreSQL when processes run on several hosts, and create "
        "its tables with `celery-recovery db upgrade` before starting workers.",
        secret=True,
    )
    redis_url: str | None = setting(
        None,
        parse=parsers.redis_url,
        doc="Redis for `@recoverable` idempotency locks, fencing tokens and remembered results. "
        "Defaults to the broker URL when the broker is Redis; with another broker, "
        "`@recoverable` tasks need it set. Unused when no task is `@recoverable`.",
        secret=True,
    )
    database_pooler: str = setting(
        "auto",
        parse=parsers.database_pooler,
        doc="Whether the PostgreSQL store is reached through a pooler in transaction mode "
        "(PgBouncer, Odyssey, PgCat, Supavisor, RDS Proxy), which gives each transaction "
        "another server session: `auto` finds out once per process tree (a pooler answers "
        "the connection with a backend process id of its own making), `transaction` says "
        "there is one, `none` that there is none. Behind one, no session state is relied "
        "on: timeouts are set per transaction (`SET LOCAL`) instead of as startup options, "
        "psycopg prepares no statement on the server, and processes hold no advisory-lock "
        "liveness marker (the process marker is used). See "
        "docs/tuning.md#connections-and-poolers.",
    )
    heartbeat_interval: float = seconds(
        _TIMING["heartbeat_interval"],
        doc="How often each worker process, beat and triggerer refreshes its job heartbeat "
        "(one row write per process per interval, whatever the number of tasks).",
    )
    zombie_threshold: float = seconds(
        _TIMING["zombie_threshold"],
        doc="Heartbeat age after which a worker process counts as dead and its running tries "
        "as zombies, to be retried or failed. Lower reacts faster to a killed worker; higher "
        "tolerates longer pauses (GC, swapping, a slow store) without false alarms. At least "
        f"{MIN_HEARTBEATS_PER_THRESHOLD} heartbeat intervals.",
    )
    health_check_threshold: float = seconds(
        _TIMING["health_check_threshold"],
        doc="Heartbeat age after which a beat or triggerer counts as dead: its job is marked "
        "failed and a warning is logged. At least "
        f"{MIN_HEARTBEATS_PER_THRESHOLD} heartbeat intervals.",
    )
    sweep_interval: float = seconds(
        _TIMING["sweep_interval"],
        doc="How often `celery-recovery sweep --loop` and the workers' fallback sweep run; when "
        "no sweep has finished for 3 intervals, live workers sweep themselves. Beat's schedule "
        "does not read it: give `recovery_beat_schedule(preset, sweep_interval)` the same "
        "value. At most the zombie threshold.",
    )
    queued_timeout: float = seconds(
        _TIMING["queued_timeout"],
        doc="Age at which a queued try that no worker has started counts as lost (counted from "
        "its ETA when it has one) and is published again. Keep it above the longest "
        "time a task may wait in a queue. A delivery published longer ago than half of it "
        "is checked against the store before it runs (redundant-delivery check).",
    )
    adoption_timeout: float = seconds(
        _TIMING["adoption_timeout"],
        doc="How long a zombie adopted by a live worker (the result backend says STARTED there) "
        "may go without that worker's own claim before it is reset.",
    )
    stalled_consumer_timeout: float = seconds(
        _TIMING["stalled_consumer_timeout"],
        doc="How long a worker may go without receiving a message, while it has free slots and "
        "its queues hold ready messages (or its broker connection is down or the broker does "
        "not answer), before it counts as stalled: `jobs check` fails for it, it logs a "
        "warning, writes an audit row and counts a metric. Its main process asks the broker "
        "for its queues' ready messages only when idle, four times per timeout. An idle "
        "worker with empty queues is never stalled. At least "
        f"{MIN_HEARTBEATS_PER_THRESHOLD} heartbeat intervals. See docs/stuck.md.",
    )
    on_stalled_consumer: str = setting(
        "report",
        parse=parsers.on_stalled,
        doc="What a stalled worker does besides reporting it: `report` (nothing more: the "
        "liveness probe `jobs check` fails, and the orchestrator restarts it) or `exit` (it "
        "shuts itself down warm, as on SIGTERM, so that its supervisor starts it again; "
        "running tasks finish or are recovered as usual).",
    )
    overdue_factor: float = setting(
        3.0,
        parse=parsers.factor,
        doc="A running try is overdue once it has run this many times its task's usual "
        "duration (the 95th percentile of the task's last 200 successful runs), and at "
        "least `recovery_overdue_min_seconds`. Overdue tries are only shown (`inspect "
        "overdue`, the console, the `celery_recovery_overdue_tries` gauge), never acted on: "
        "they make a hang visible in a task without `recovery_heartbeat_timeout`. See "
        "docs/stuck.md.",
    )
    overdue_min_runs: int = setting(
        20,
        parse=parsers.positive_count,
        doc="Successful runs of a task the store must hold before any of its tries can be "
        "overdue: with fewer, its usual duration is unknown.",
    )
    overdue_min_seconds: float = seconds(
        60.0,
        doc="Shortest run after which a try can be overdue, however quick its task usually is.",
    )
    max_republish: int = setting(
        3,
        parse=parsers.count,
        doc="Times a lost message is published again before its task is failed as lost "
        "(0: fail it at once). Retries after a dead worker are bounded by the task's "
        "`max_retries` instead.",
    )
    # As many runs as Celery's default max_retries (3) allows.
    max_lost_runs: int = setting(
        4,
        parse=parsers.positive_count,
        doc="Runs of one try that may each end with the death of their process (its message "
        "coming back, with `acks_late`) before the try is failed instead of run again, for "
        "a task whose `max_retries` is None (Celery's retry for ever). A task with a "
        "`max_retries` gets `max_retries + 1` runs in all, each death counting as a retry. "
        "See docs/failure-modes.md.",
    )
    unknown_outcome: str = setting(
        "rerun",
        parse=parsers.unknown_outcome,
        doc="What a sweep does with a dead worker's running try when nothing can tell whether "
        "it had finished: no result backend is configured, the backend is `rpc://` (which "
        "answers only the caller), or the task stores no result (`ignore_result`). `rerun` "
        "publishes it again, as the next try (at least once: a try that had finished just "
        "before its worker died, its outcome not yet in the store, runs a second time); "
        "`fail` fails it (`on_failure` and the failure listeners run), so it never runs "
        "twice but may not run at all. A task attribute of the same name "
        "(`@app.task(recovery_unknown_outcome='fail')`) overrides it for that task. A try "
        "that never started is published again either way. See docs/backends.md.",
    )
    callback_timeout: float = seconds(
        30.0,
        doc="How long one failure callback (`on_failure`, `on_retry`, the `task_failure` signal "
        "or a failure listener) may run before the sweep moves on; it is left running in its "
        "thread. The claim on a callback row lasts 4 times this plus 10 s.",
    )
    triggerer_capacity: int = setting(
        1000,
        parse=parsers.positive_count,
        doc="Most triggers one triggerer process runs at once (its `--capacity` overrides it).",
    )
    trigger_allowed_modules: tuple[str, ...] | None = setting(
        None,
        parse=parsers.module_prefixes,
        doc="Modules (and their submodules) a triggerer may import trigger classes from. Unset: "
        "`celery_recovery` and the top-level packages of the app's own tasks. A class path "
        "stored in the database outside these is refused, never imported.",
    )
    liveness_markers: str = setting(
        "auto",
        parse=parsers.liveness_markers,
        doc="Markers that find a dead process without waiting for the zombie threshold: the "
        "marker watch of whoever sweeps (`sweep --loop`, a beat that schedules the sweep, a "
        "worker's fallback, every triggerer) looks twice a second, and a process it saw "
        "holding a marker that is now gone is dead at once (a lock: gone for a second, on the"
        " same server, with no heartbeat since); one whose marker is present is judged by the"
        " threshold. `auto`: a PostgreSQL advisory lock on a connection of its own (one per "
        "worker, beat and triggerer, when the store is PostgreSQL) and the process id with "
        "its start time (checked by a sweep on the same host). `process`: the second only. "
        "Behind a transaction-mode pooler (see `recovery_database_pooler`) `auto` holds no "
        "lock: a session lock cannot be held there. `off`: heartbeats alone. See "
        "docs/failure-modes.md.",
    )
    beat_catch_up_window: float = seconds(
        86400.0,
        doc="With `celery_recovery.beat:Scheduler`: how late a scheduled run no beat sent in time "
        "(every beat down, or no leader yet) may be and still be sent, under the entry's "
        "catch-up policy (`latest`, the default: the newest missed run once; `all`: each one). "
        "An entry's `options={'recovery': {'catch_up_window': ...}}` overrides it. "
        "See docs/beat.md.",
    )
    beat_entries: str = setting(
        "beat_schedule",
        parse=parsers.beat_entries,
        doc="With `celery_recovery.beat:Scheduler`: where its entries come from. `beat_schedule`: "
        "the app's `beat_schedule`, read at start. `django`: django-celery-beat's models "
        "(`PeriodicTask` and its schedules, as edited in the Django admin; changes are picked "
        "up within seconds), after the app's `beat_schedule` is written into them as "
        "django-celery-beat's `DatabaseScheduler` does. A Django project sets "
        '`CELERY_RECOVERY_BEAT_ENTRIES = "django"`. See docs/beat.md.',
    )
    metrics_port: int | None = setting(
        None,
        parse=parsers.port,
        doc="TCP port on which Prometheus metrics are served at `/metrics` by the processes that "
        "read it: `celery-recovery sweep --loop` (its `--metrics-port` overrides it), the "
        "triggerer, and a worker's main process when `PROMETHEUS_MULTIPROC_DIR` is set (or "
        "its pool runs tasks in the main process). Unset: nothing listens. See docs/metrics.md.",
    )
    exclude_tasks: tuple[str, ...] = setting(
        (),
        parse=parsers.patterns,
        doc="Task names (glob patterns, e.g. `metrics.*`) celery-recovery leaves alone: such a "
        "task records nothing when published or run, costs nothing beyond one cached name "
        "look-up, and is never recovered (a killed or lost one is gone, as with plain "
        "Celery). For trivial high-rate tasks; see docs/tuning.md.",
    )
    exclude_queues: tuple[str, ...] = setting(
        (),
        parse=parsers.patterns,
        doc="Queues (glob patterns, matched against the message's routing key: the queue's name "
        "with Celery's default routing) whose tasks celery-recovery leaves alone, as "
        "`recovery_exclude_tasks` does. Each message pays one cached look-up of its routing "
        "key while this is set.",
    )
    doctor_at_start: bool = setting(
        True,
        parse=parsers.flag,
        doc="Whether a worker runs `celery-recovery doctor`'s checks once when it is ready, in a "
        "thread of its main process (never delaying or breaking the worker), and logs each "
        "finding as a warning. See docs/doctor.md.",
    )
    longest_eta: float | None = setting(
        None,
        parse=parsers.optional_duration,
        doc="Longest countdown or ETA (how far ahead) the app's tasks are published with. A "
        "worker holds such a message unacknowledged until it is due, so the doctor compares "
        "it with the broker's visibility timeout (Redis, SQS) and RabbitMQ's consumer "
        "timeout. Unset: the doctor uses the farthest ETA of the queued tries in the store.",
        unit="s",
    )
    web_token: str | None = setting(
        None,
        parse=parsers.web_token,
        doc="Bearer token the console (`celery-recovery web`) requires of every request "
        "(`Authorization: Bearer TOKEN`, or `?token=TOKEN` once, which sets a cookie). "
        "Unset: no token. The console refuses to serve on an interface other than the "
        "loopback without this or `recovery_web_credentials`. See docs/console.md.",
        secret=True,
    )
    web_credentials: str | None = setting(
        None,
        parse=parsers.web_credentials,
        doc="`user:password` the console requires with HTTP basic authentication. Unset: none. "
        "Prefer the environment variable, so the password stays out of code.",
        secret=True,
    )

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
        values = read_app_conf(app)
        settings = cls(**app_values(app, **overrides))
        report_unread(app, values, settings.database_url)
        return settings


#: Every setting, in the order of the fields: the configuration reference's order.
SETTINGS: tuple[SettingSpec, ...] = tuple(
    SettingSpec(f.name, f.default, f.metadata["parse"], f.metadata["doc"], f.metadata["unit"])
    for f in fields(RecoverySettings)
)

_SPECS = {spec.name: spec for spec in SETTINGS}


def app_values(app: Any, **overrides: Any) -> dict[str, Any]:
    """Every setting of a Celery app, parsed, by name, as :meth:`RecoverySettings.from_app`
    reads them, before the relations between them are checked (see
    :func:`~celery_recovery.core.timing_relations.relation_problems`).  A value that cannot
    be parsed still raises."""
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
    return {spec.name: values.get(spec.name, spec.default) for spec in SETTINGS}


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
    # Settings built directly, not parsed from their sources, get their durations checked here.
    for spec in SETTINGS:
        value = getattr(s, spec.name)
        if spec.parse is parsers.duration or (
            spec.parse is parsers.optional_duration and value is not None
        ):
            parsers.duration(spec.conf_key, value)
    problems = relation_problems({spec.name: getattr(s, spec.name) for spec in SETTINGS})
    if problems:
        raise ConfigurationError(problems[0][1])
