"""What a marker says about its process."""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """``GONE``: the process is dead.  ``PRESENT``: it still holds its marker (alive, maybe
    paused).  ``UNKNOWN``: the marker cannot be checked from here; judge by the threshold."""

    GONE = "gone"
    PRESENT = "present"
    UNKNOWN = "unknown"
