"""Thresholds that misjudge a pause: the relations ``Recovery(app)`` refuses (all of
them at once, where a worker stops at the first), and values it accepts that still
take an ordinary pause for a death."""

from __future__ import annotations

from celery_recovery.core.app_conf import PREFIX
from celery_recovery.core.presets import PRESETS
from celery_recovery.core.timing_relations import MIN_HEARTBEATS_PER_THRESHOLD, relation_problems
from celery_recovery.doctor.deployment import Deployment
from celery_recovery.doctor.findings import Report, Severity

NAME = "thresholds"

#: Shortest zombie or health threshold advised outside tests: the ``kubernetes``
#: preset's.  A GC pause, swapping, a VM stall or a slow store commit lasts seconds.
PAUSE_TOLERANCE = PRESETS["kubernetes"]["zombie_threshold"]
#: Threshold over heartbeat interval of the ``default`` preset, used to suggest values.
DEFAULT_RATIO = PRESETS["default"]["zombie_threshold"] / PRESETS["default"]["heartbeat_interval"]


def check(d: Deployment, report: Report) -> None:
    values = d.values
    if values is None:
        report.found(
            "settings-refused",
            Severity.ERROR,
            "recovery_* settings",
            f"{d.settings_error}. Recovery(app) refuses these settings, so a worker that "
            "installs it does not start, and one that does not records nothing.",
            "correct the setting named above (docs/configuration.md lists each one)",
        )
        return
    heartbeat = values["heartbeat_interval"]
    report.note(
        f"settings: heartbeat_interval {heartbeat:g}s, zombie_threshold "
        f"{values['zombie_threshold']:g}s, health_check_threshold "
        f"{values['health_check_threshold']:g}s, sweep_interval {values['sweep_interval']:g}s "
        f"(preset {values['preset']!r})"
    )
    for key, message in relation_problems(values):
        report.found(
            "settings-refused",
            Severity.ERROR,
            key,
            f"{message}. Recovery(app) refuses these settings: a worker that installs it "
            "does not start.",
            _relation_fix(key, values),
        )
    for name, what in (
        ("zombie_threshold", "a live worker's running tasks count as zombies and run again"),
        ("health_check_threshold", "a live beat or triggerer counts as dead"),
    ):
        value = values[name]
        if MIN_HEARTBEATS_PER_THRESHOLD * heartbeat <= value < PAUSE_TOLERANCE:
            report.found(
                f"{name.replace('_', '-')}-short",
                Severity.WARNING,
                PREFIX + name,
                f"{PREFIX}{name}={value:g}s: a pause that long (garbage collection, swapping, "
                f"a VM stall, a slow store commit) and {what}, while the paused process "
                "carries on when it wakes: the task runs twice.",
                f"app.conf.{PREFIX}{name} = {PAUSE_TOLERANCE:g} or more (the 'kubernetes' "
                f"preset: app.conf.{PREFIX}preset = 'kubernetes'); the 'aggressive' preset is "
                "for tests and demos",
            )


def _relation_fix(key: str, values: dict) -> str:
    heartbeat = values["heartbeat_interval"]
    if key == PREFIX + "sweep_interval":
        shortest = min(values["zombie_threshold"], values["health_check_threshold"])
        return f"app.conf.{PREFIX}sweep_interval = {shortest:g} (or less)"
    suggestion = max(DEFAULT_RATIO * heartbeat, PAUSE_TOLERANCE)
    return (
        f"app.conf.{key} = {suggestion:g} (at least {MIN_HEARTBEATS_PER_THRESHOLD} x "
        f"{PREFIX}heartbeat_interval = {MIN_HEARTBEATS_PER_THRESHOLD * heartbeat:g}), or a "
        f"shorter {PREFIX}heartbeat_interval"
    )
