"""Every name celery-recovery adds to what travels with a task, declared once.

Message headers our handlers stamp (a task reads them on ``self.request``), and the
keys a try's record keeps of the caller's reply route.  All start with ``recovery_``:
no other header of a message is ours.
"""

from __future__ import annotations

#: The publisher's publish time (POSIX seconds); a republish gets a fresh one.
PUBLISHED_AT_HEADER = "recovery_published_at"
#: The host of a publisher that is itself a job (a worker process, beat, a triggerer): a
#: host lost with its processes loses that publisher's buffer too.
PUBLISHED_ON_HEADER = "recovery_published_on"
#: On a message published by a run that may repeat an earlier one: how many publishes it
#: is from that run (1 for its own sends).
RESENT_HEADER = "recovery_resent"
#: A resumed try's method, its kwargs and the trigger's event (``defer()``).
RESUME_HEADER = "recovery_resume"
#: A beat run's scheduled time (ISO 8601, UTC); a task reads it as
#: ``self.request.get("recovery_scheduled_at")``.
SCHEDULED_AT_HEADER = "recovery_scheduled_at"
#: Request attribute a worker's main process stamps when it receives the message.
RESERVED_AT_HEADER = "recovery_reserved_at"
#: Request attribute it stamps when the broker handed the message out before (SQS).
RECEIVED_BEFORE_HEADER = "recovery_received_before"

#: Where a record's ``headers`` keep the caller's reply queue (``rpc://``).
REPLY_TO_KEY = "recovery_reply_to"
#: Where they keep the correlation id, when it is not the task id (Celery's own default).
CORRELATION_ID_KEY = "recovery_correlation_id"
#: Both: kept in a record, never sent as message headers.
ROUTE_KEYS = (REPLY_TO_KEY, CORRELATION_ID_KEY)
