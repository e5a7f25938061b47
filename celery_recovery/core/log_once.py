"""Log a recurring problem once, not on every occurrence.

A failing metric, signal handler or setting would otherwise repeat the same
warning for every task.  Callers log the first occurrence of each key as a
warning and later ones at debug level (or not at all).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable


class LogOnce:
    """Which keys were already logged, by this process.

    With ``every`` (seconds), a key is due again once that long has passed since
    it was last logged: a condition that lasts is still reported, but rarely.
    """

    def __init__(
        self, every: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._logged_at: dict[Hashable, float] = {}

    def first(self, key: Hashable) -> bool:
        """True when ``key`` is to be logged now (and records that it was)."""
        now = self._clock()
        with self._lock:
            last = self._logged_at.get(key)
            if last is not None and (self.every is None or now - last < self.every):
                return False
            self._logged_at[key] = now
            return True
