"""Loaded only in processes run by tests/fleet/elsewhere.sh, under libfaketime with
FAKETIME_DONT_FAKE_MONOTONIC=1: there Python's ``time.sleep`` fails with EINVAL (its
absolute monotonic deadline is shifted by the fake), while waits with a relative timeout
work.  ``time.sleep`` then waits with ``select``'s relative timeout instead."""

import os
import select
import time

if os.environ.get("FAKETIME") and os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1":

    def _sleep(seconds: float) -> None:
        if seconds > 0:
            select.select([], [], [], seconds)

    time.sleep = _sleep
