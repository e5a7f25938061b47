"""Celery's dispatch of the signals sent for every task, made to remember its receivers.

A Celery :class:`~celery.utils.dispatch.Signal` can keep, per sender, the
receivers it found (``use_caching``); the ones sent for every task do not, so
each send takes the signal's lock and walks its whole list of receivers again.
celery-recovery's handlers make those signals non-empty in every process, so
it turns the cache on for them: about 5,000 of the 34,000 instructions a
send costs a handler (docs/performance.md).  ``connect`` and ``disconnect`` empty
the cache, as they do for any caching signal, so a receiver connected later
(the user's, at any time) is seen at the next send, and a receiver held weakly
that dies is dropped at the next send as before.
"""

from __future__ import annotations

from celery.signals import after_task_publish, before_task_publish, task_postrun, task_received
from celery.utils.dispatch import Signal

#: The signals Celery sends for every task that celery-recovery receives.
PER_TASK_SIGNALS = (before_task_publish, after_task_publish, task_received, task_postrun)


def cache_receivers(signal: Signal) -> None:
    """Turn on ``signal``'s cache of receivers per sender (idempotent)."""
    with signal.lock:
        if signal.use_caching:
            return
        # A plain dict, not the weak one Celery makes for a signal built with the
        # cache: these senders are task names (strings, which cannot be weakly
        # referenced), task objects and the worker's consumer, all as long-lived as
        # the process and few.
        signal.sender_receivers_cache = {}
        signal.use_caching = True
