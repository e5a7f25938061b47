"""The relations the timing settings must keep to one another.

Each timing setting may be sound on its own and still, next to another, take a
pause for a death or let a death wait longer than promised.  The settings refuse
the first such problem; ``celery-recovery doctor`` reports them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_recovery.core.app_conf import PREFIX

#: A zombie threshold must cover at least this many heartbeat intervals, or one
#: late heartbeat (a GC pause, a slow commit) would declare a live worker dead.
MIN_HEARTBEATS_PER_THRESHOLD = 3


def relation_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every way the timing ``values`` (parsed, by setting name) misjudge a pause or a
    death, as (setting key, message naming it and why); empty when they are sound.

    :class:`~celery_recovery.core.settings.RecoverySettings` refuses the first;
    ``celery-recovery doctor`` reports all.
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
