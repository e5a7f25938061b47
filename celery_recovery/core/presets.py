"""Timing presets: how fast recovery reacts, traded against false alarms.

``default`` suits long-lived VMs; ``kubernetes`` reacts within seconds to pod
evictions and OOM kills; ``aggressive`` is for tests and demos (a GC pause of a
couple of seconds would count as a dead worker).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from celery_recovery.core.errors import ConfigurationError

#: The preset that applies when none is chosen: its values are the timing settings' defaults.
DEFAULT_PRESET = "default"

PRESETS: MappingProxyType[str, MappingProxyType[str, float]] = MappingProxyType(
    {
        "default": MappingProxyType(
            {
                "heartbeat_interval": 5.0,
                "zombie_threshold": 30.0,
                "health_check_threshold": 30.0,
                "sweep_interval": 5.0,
                "queued_timeout": 600.0,
                "adoption_timeout": 600.0,
                "stalled_consumer_timeout": 60.0,
            }
        ),
        "kubernetes": MappingProxyType(
            {
                "heartbeat_interval": 2.0,
                "zombie_threshold": 10.0,
                "health_check_threshold": 10.0,
                "sweep_interval": 2.0,
                "queued_timeout": 300.0,
                "adoption_timeout": 300.0,
                "stalled_consumer_timeout": 30.0,
            }
        ),
        "aggressive": MappingProxyType(
            {
                "heartbeat_interval": 0.5,
                "zombie_threshold": 2.0,
                "health_check_threshold": 2.0,
                "sweep_interval": 1.0,
                "queued_timeout": 30.0,
                "adoption_timeout": 30.0,
                "stalled_consumer_timeout": 10.0,
            }
        ),
    }
)


def preset_settings(name: str) -> dict[str, Any]:
    """The settings of preset ``name``, to pass as ``Recovery(app, **preset_settings(name))``."""
    try:
        return dict(PRESETS[name])
    except KeyError:
        allowed = ", ".join(repr(p) for p in PRESETS)
        raise ConfigurationError(f"preset={name!r} is not a preset; allowed: {allowed}") from None
