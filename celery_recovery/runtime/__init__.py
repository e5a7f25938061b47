"""What every mechanism is given, and what one process holds for an installed app.

:mod:`.context` is the :class:`~celery_recovery.runtime.context.RecoveryContext` each
mechanism receives (the app, its settings, the store, this process's runtime, a clock),
found by app from signal handlers.  :mod:`.process` is this process's runtime, built anew
after a fork: the write-behind writer (:mod:`.write_behind`), the job heartbeat thread
that keeps this process's job row fresh (:mod:`.job_heartbeat`; not Celery beat, nor a
task's own heartbeat), and the store health both report to (:mod:`.health`).
"""
