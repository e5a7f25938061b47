"""One leader among any number of beats: a lease in the store with a fencing token.

The leader renews the ``beat-leader`` lease every :attr:`Leadership.renew_every`
seconds; a standby tries to take it as often.  The lease lasts
``recovery_sweep_interval`` seconds, so a SIGKILLed or paused leader is replaced
within a sweep interval and a renewal period (under a sweep plus a heartbeat
interval, the bound of a dead worker).  Each new holder gets the next token.

A standby need not wait for the lease to run out when the leader is dead: every
:data:`STANDBY_LOOK` seconds it looks at the leader's liveness markers
(:mod:`.leader_markers`), and takes the lease from a leader whose process is gone,
or whose advisory lock two looks found missing, with a compare-and-set on the
dead leader's token.  Taking it from a leader that was in fact alive only hands the
lead over: the fence below keeps each run sent once.

The token is only half the fence: a leader publishes a claimed run only while
its lease, as measured on its own monotonic clock from before the renewal that
confirmed it, has a quarter of its length left.  A leader that wakes from a
pause, or that cannot reach the store, therefore publishes nothing: its claims
fail in the store (they check the token and the expiry in the same statement),
and a run it claimed just before the pause is left to the next leader.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from datetime import datetime

from celery_recovery.beat.leader_markers import LeaderMarkers
from celery_recovery.core.errors import StoreError
from celery_recovery.core.process_id import HOSTNAME
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.runtime.health import StoreHealth
from celery_recovery.store import BEAT_LEASE, Fence, Store

logger = logging.getLogger("celery_recovery.beat")

#: The lease the leading beat holds (a row of the ``leases`` table).
LEASE = BEAT_LEASE
#: Part of the lease's length kept in hand: a publish starts only with more left.
SAFETY = 0.25
#: Seconds between a standby's looks at the lease and at its leader's markers.
STANDBY_LOOK = 0.5


_holders: dict[int, str] = {}


def holder_name() -> str:
    """This process's name as a lease holder: unique, and saying where it runs.

    One per process: ``celery beat`` builds a second scheduler for its banner.
    """
    pid = os.getpid()
    if pid not in _holders:
        _holders[pid] = f"{uuid.uuid4().hex[:8]}:{pid}@{HOSTNAME}"[:64]
    return _holders[pid]


class Leadership:
    """This beat's view of the lease: whether it leads, with which token, until when."""

    def __init__(
        self,
        store: Store,
        settings: RecoverySettings,
        clock: Callable[[], datetime],
        holder: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        health: StoreHealth | None = None,
    ) -> None:
        self.store = store
        #: Logs the first failure of an outage and the recovery, not every attempt.
        self.health = health or StoreHealth(settings.masked_database_url)
        self.clock = clock
        self.holder = holder or holder_name()
        self.ttl = settings.sweep_interval
        #: Seconds between renewals (leader) or attempts to take the lease (standby).
        self.renew_every = min(settings.heartbeat_interval / 2, self.ttl / 3)
        self.token: int | None = None
        self.leader_markers = LeaderMarkers(store, settings)
        self._monotonic = monotonic
        self._valid_until = 0.0
        self._next_attempt = 0.0

    @property
    def leading(self) -> bool:
        return self.token is not None

    @property
    def fence(self) -> Fence:
        assert self.token is not None, "only a leader has a fence"
        return Fence(LEASE, self.holder, self.token)

    def refresh(self, force: bool = False) -> tuple[bool, int | None]:
        """Renew or try to take the lease when due; returns (gained the lead now, the token
        the lead was lost with, if it was)."""
        started = self._monotonic()
        if not force and started < self._next_attempt:
            return False, None
        previous = self.token
        self._next_attempt = started + (
            self.renew_every if previous is not None else min(self.renew_every, STANDBY_LOOK)
        )
        try:
            token = self.store.leases.acquire_lease(LEASE, self.holder, self.clock(), self.ttl)
        except StoreError as exc:
            # Tried again at the same pace (no backoff): the lead must not wait once
            # the store is back.
            self.health.record_failure(exc, "renewing or taking the beat lead")
            token = None
        else:
            self.health.record_success()
        if token is None and previous is None:
            token = self._take_from_dead_leader()
        if token is None:
            self.token = None
            if previous is not None:
                logger.warning(
                    "celery-recovery beat: lost the lead (token %s); standing by", previous
                )
                return False, previous
            return False, None
        self.token = token
        self._valid_until = started + self.ttl * (1 - SAFETY)
        if token != previous:
            logger.info(
                "celery-recovery beat: leading as %s with fencing token %s", self.holder, token
            )
            return True, None
        return False, None

    def _take_from_dead_leader(self) -> int | None:
        try:
            lease = self.store.leases.lease(LEASE)
            dead = self.leader_markers.dead_holder(lease)
            if dead is None:
                return None
            holder, token = dead
            taken = self.store.leases.take_over_lease(
                LEASE, self.holder, holder, token, self.clock(), self.ttl
            )
        except StoreError as exc:
            logger.debug("celery-recovery beat: could not look at the leader's markers: %s", exc)
            return None
        if taken is not None:
            logger.warning(
                "celery-recovery beat: leader %s is dead (its liveness marker is gone); "
                "taking the lead from it before its lease ends",
                holder,
            )
        return taken

    def may_publish(self) -> bool:
        """Whether this leader's lease surely still holds for a publish started now."""
        return self.token is not None and self._monotonic() < self._valid_until

    def wait(self) -> float:
        """Seconds until the next renewal or attempt is due."""
        return max(0.0, self._next_attempt - self._monotonic())

    def release(self) -> None:
        """Give the lease up (a clean shutdown), so a standby takes over at once."""
        if self.token is None:
            return
        self.token = None
        try:
            self.store.leases.release_lease(LEASE, self.holder)
        except StoreError as exc:
            logger.info("celery-recovery beat: could not release the lead: %s", exc)
