"""The one check that a duration is a positive, finite number of seconds.

Settings, ``@recoverable``'s options, ``defer(timeout=...)``, trigger arguments
and CLI options all take durations in seconds.  They share this check so a
``True``, a NaN or an infinity is refused the same way everywhere (each would
otherwise pass a plain ``> 0`` test and fail later, far from its cause), and
so every message names the argument and the value given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta

from celery_recovery.core.errors import ConfigurationError


def positive_seconds(
    name: str,
    value: object,
    error: Callable[[str], Exception] = ConfigurationError,
    *,
    timedelta_ok: bool = False,
    text_ok: bool = False,
) -> float:
    """``value`` as seconds, or ``error(message)`` naming ``name`` and ``value``.

    Accepts an int or a float (never a bool), also a ``timedelta`` when
    ``timedelta_ok`` and a numeric string (an environment variable's) when
    ``text_ok``.  The result is above zero and finite.
    """
    given = value
    if isinstance(value, timedelta) and timedelta_ok:
        value = value.total_seconds()
    elif isinstance(value, str) and text_ok:
        try:
            value = float(value.strip())
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, int | float):
        also = " or a timedelta" if timedelta_ok else ""
        raise error(f"{name}={given!r} is not a number of seconds{also}")
    try:
        result = float(value)
    except OverflowError:  # an int too large for a float: certainly not a sane duration
        result = math.inf
    if not math.isfinite(result):
        raise error(f"{name}={given!r} is not a finite number of seconds")
    if not result > 0:
        raise error(f"{name}={given!r} must be a positive number of seconds")
    return result
