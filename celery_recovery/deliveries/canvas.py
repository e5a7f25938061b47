"""Chords on result backends without native chords: publish each body once.

Such backends (``db+...``, and every backend whose ``apply_chord`` falls back
to polling) run Celery's ``celery.chord_unlock``: one task per chord, which
polls the header's results and retries itself (``max_retries=None``) until
they are ready, then publishes the body with ``callback.delay``.  Nothing in
Celery de-duplicates that publish.  After a crash there can be two copies of
one unlock task: the broker's redelivery of the dead worker's message and the
try a sweep published in its place, or a try killed after it published the
body and retried by the zombie sweep.  Each copy would publish the body.

Every copy of one chord's unlock task carries the same task id (its retries
and our re-publishes keep it; applying a chord again, even a frozen one,
sends a new unlock task), so the body is published under a store claim named
after that id: the first copy to claim it publishes, the others see it done
and only end.  A copy whose claim is held by another one waits for it to be
completed, or to expire when its holder died before publishing.  Without the
store the body is published anyway: a crash may then duplicate it, but a store
outage never stalls a chord.

Native chords (the Redis backend) count header parts in the backend itself;
Celery 5.7 records each header task once (by task id and header index) and
claims the body's dispatch there, so nothing is needed for them.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from celery.canvas import maybe_signature

from celery_recovery.core.errors import StoreError
from celery_recovery.core.patching import wrap_once
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import CLAIM_NAME_MAX, CLAIM_PREFIX, Claim

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.canvas")

UNLOCK_TASK = "celery.chord_unlock"
#: Seconds a claim stays held before a contender may take it over (its holder died).
CLAIM_TTL = 30.0
#: Seconds between two looks at a claim another unlock copy holds.
CLAIM_POLL = 0.2


def install_chord_body_once(context: RecoveryContext) -> None:
    """Make the app's ``celery.chord_unlock`` publish each chord body at most once."""
    app = context.app

    def install(*_: Any, **__: Any) -> None:
        task = app.tasks.get(UNLOCK_TASK)
        if task is not None:
            _wrap_unlock(type(task), context)

    if app.finalized:
        install()
    else:
        app.on_after_finalize.connect(install, weak=False)


def claim_name(unlock_task_id: str) -> str:
    """The store claim that guards the body publish of one chord's unlock task."""
    name = f"{CLAIM_PREFIX}chord-body:{unlock_task_id}"
    if len(name) <= CLAIM_NAME_MAX:
        return name
    # Celery's ids are UUIDs; a longer custom id is hashed to fit the column.
    return f"{CLAIM_PREFIX}chord-body:{hashlib.sha256(unlock_task_id.encode()).hexdigest()[:40]}"


def _wrap_unlock(cls: Any, context: RecoveryContext) -> None:
    def wrap(original: Any) -> Any:
        def run(self: Any, group_id: Any, callback: Any, *args: Any, **kwargs: Any) -> Any:
            body = maybe_signature(callback, app=self.app)
            if body is not None and self.request.id and not self.request.is_eager:
                _publish_once(context, body, claim_name(self.request.id))
            return original(self, group_id, body, *args, **kwargs)

        return run

    wrap_once(cls, "run", wrap, per_class=True)


def _publish_once(context: RecoveryContext, body: Any, name: str) -> None:
    """Replace ``body.delay`` (what chord_unlock publishes with) by a claimed publish."""
    publish = body.delay

    def delay(*args: Any, **kwargs: Any) -> Any:
        holder = uuid.uuid4().hex
        claim = _claim(context, name, holder)
        if claim is Claim.DONE:
            logger.warning(
                "celery-recovery: chord body %s[%s] already published (%s); not again",
                body.get("task"),
                body.id,
                name,
            )
            return None
        try:
            result = publish(*args, **kwargs)
        except BaseException:
            if claim is Claim.WON:
                _quietly(
                    context, "releasing", lambda: context.store.claims.release_claim(name, holder)
                )
            raise
        if claim is Claim.WON:
            done = lambda: context.store.claims.complete_claim(name, holder, utcnow())  # noqa: E731
            _quietly(context, "completing", done)
        return result

    body.delay = delay


def _claim(context: RecoveryContext, name: str, holder: str) -> Claim | None:
    """WON or DONE, after waiting out another holder; None when the store cannot tell."""
    deadline = time.monotonic() + CLAIM_TTL + 5 * CLAIM_POLL
    while True:
        try:
            claim = context.store.claims.claim_once(name, holder, utcnow(), CLAIM_TTL)
        except StoreError as exc:
            # Availability over certainty: a store outage must not stall the chord.
            context.runtime.health.record_failure(exc, f"claiming the publish of {name}")
            return None
        if claim is not Claim.HELD:
            return claim
        if time.monotonic() > deadline:
            return None
        time.sleep(CLAIM_POLL)


def _quietly(context: RecoveryContext, what: str, call: Any) -> None:
    try:
        call()
    except StoreError as exc:
        context.runtime.health.record_failure(exc, f"{what} a chord body claim")
