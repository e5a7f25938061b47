"""The Celery app the real-worker tests run, configured from the environment.

The worker subprocess imports ``app`` from here, configured by
``RECOVERY_TEST_BROKER``, ``RECOVERY_TEST_BACKEND`` and ``RECOVERY_TEST_QUEUE``
plus the package's own ``CELERY_RECOVERY_*`` variables; with
``RECOVERY_TEST_PLAIN=1`` it runs plain Celery.  Tests build their
publishing app with :func:`create_app` so each test has its own store and queue.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from typing import Any

from celery import Celery, Task
from celery._state import get_current_worker_task
from celery.exceptions import Reject
from celery.signals import after_task_publish

from celery_recovery import (
    Recovery,
    TaskResultTrigger,
    TimeDeltaTrigger,
    current_fencing_token,
    defer,
    heartbeat,
    heartbeat_details,
    recoverable,
)
from tests.apps import canvas_tasks, triggers

#: kombu's filesystem transport (the demo's broker), its folder after the scheme here.
FILESYSTEM = "filesystem://"

#: Seconds each SQS receive waits on the server for a message (kombu's default is 10):
#: short, so that the tests wait less for the receives a killed worker left open.
SQS_WAIT_TIME = 2


def sqs_transport_options(
    visibility_timeout: float | None = None, wait_time: int = SQS_WAIT_TIME
) -> dict[str, Any]:
    """kombu's SQS transport against the local server (plain HTTP, any region).

    An idle worker has a receive open nearly all the time (0.2 s between empty
    receives instead of kombu's 1 s), as a killed one then has.  SQS takes a
    whole number of seconds for the queue's visibility timeout, which kombu sets when
    it creates the queue (30 minutes unless given)."""
    options: dict[str, Any] = {
        "region": "us-east-1",
        "is_secure": False,
        "wait_time_seconds": wait_time,
        "polling_interval": 0.2,
    }
    if visibility_timeout is not None:
        options["visibility_timeout"] = math.ceil(visibility_timeout)
    return options


def create_app(
    broker: str,
    backend: str,
    queue: str,
    recovery: dict[str, Any] | None = None,
    acks_late: bool = False,
    reject_on_worker_lost: bool = False,
    visibility_timeout: float | None = None,
    prefetch_multiplier: int = 1,
    sqs_wait_time: int = SQS_WAIT_TIME,
) -> Celery:
    """A lifecycle app; ``recovery`` holds the overrides to install celery-recovery with.

    ``visibility_timeout`` also makes kombu look for unacknowledged messages to
    restore every second (instead of every ~100 s), so tests see redelivery soon.
    """
    app = Celery("lifecycle", set_as_current=False)
    app.conf.update(
        broker_url=broker,
        result_backend=backend,
        task_default_queue=queue,
        task_track_started=True,
        worker_prefetch_multiplier=prefetch_multiplier,
        broker_connection_retry_on_startup=True,
        accept_content=["json", "pickle"],
        result_accept_content=["json", "pickle"],
        task_acks_late=acks_late,
        task_reject_on_worker_lost=reject_on_worker_lost,
    )
    if broker.startswith(FILESYSTEM):
        # The folder travels in the URL (the tests' convention); kombu takes it as options.
        folder = broker[len(FILESYSTEM) :]
        app.conf.broker_url = FILESYSTEM
        app.conf.broker_transport_options = {
            "data_folder_in": f"{folder}/data",
            "data_folder_out": f"{folder}/data",
            "control_folder": f"{folder}/control",
        }
    elif broker.startswith("sqs://"):
        app.conf.broker_transport_options = sqs_transport_options(visibility_timeout, sqs_wait_time)
    elif visibility_timeout is not None:
        app.conf.broker_transport_options = {
            "visibility_timeout": visibility_timeout,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            # A worker SIGKILLed during its restore pass leaves kombu's restore mutex held
            # until it expires (300 s by default): no restore at all for the test's length.
            "unacked_mutex_expire": 5,
        }
    _register_tasks(app)
    canvas_tasks.register(app)
    if recovery is not None:
        Recovery(app, **recovery)
    return app


def _append(path: str, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(line + "\n")


def resumed(task, event, ledger):
    """Where a deferred ``wait`` resumes, on a worker, with its trigger's event."""
    _append(ledger, f"resumed {task.request.id} pid={os.getpid()}")
    return {"event": event, "try": task.request.retries + 1}


def _end_worker_once_the_chain_ran(sender=None, headers=None, **_):
    """Celery publishes a chain's next step (or the chord it is) before it stores the
    step's own result.  A first run of ``dies_after_next_step`` waits in its last such
    publish (the next step, or a chord's last header part) until the chain's last task has
    finished in sibling processes, then SIGKILLs its whole worker: the step is run again."""
    task = get_current_worker_task()
    if task is None or task.name != "lifecycle.dies_after_next_step" or task.request.retries:
        return
    if not headers or headers.get("parent_id") != task.request.id:
        return
    last = task.request.chain[0]["options"]["task_id"]
    following = task.request.chain[-1]
    # A chord publishes its unlock task first, then its header parts in order.
    header = following["kwargs"]["header"] if following["task"] == "celery.chord" else None
    last_part = len(header["kwargs"]["tasks"]) - 1 if header else None
    if headers["id"] != last and (last_part is None or headers.get("group_index") != last_part):
        return
    chain_end = task.app.AsyncResult(last)
    deadline = time.monotonic() + 30
    while not chain_end.ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _overrun(self, ledger):
    """Sleeps past its task's time limit (lets SoftTimeLimitExceeded escape)."""
    _append(ledger, f"start try={self.request.retries + 1} pid={os.getpid()}")
    time.sleep(60)


def log_failure_listeners(app: Celery, path: str) -> None:
    """A failure listener that appends what it hears to ``path`` (whichever process sweeps:
    the test's, or a worker's fallback sweep)."""
    from celery_recovery.recovery import recovery_for_app

    def listener(task_id, task_name, try_number, kind, exception):
        _append(path, f"{kind} {task_id} try={try_number} {type(exception).__name__}")

    recovery_for_app(app).add_failure_listener(listener)


class LedgerTask(Task):
    """Records each on_failure/on_retry call in the task's ledger file."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        _append(args[0], f"on_failure {type(exc).__name__} pid={os.getpid()}")

    def on_retry(self, exc, task_id, args, kwargs, einfo):
        _append(args[0], f"on_retry {type(exc).__name__} pid={os.getpid()}")


def _register_tasks(app: Celery) -> None:
    @app.task(shared=False, name="lifecycle.add")
    def add(x, y):
        return x + y

    @app.task(shared=False, name="lifecycle.noop")
    def noop():
        return None

    @app.task(shared=False, name="lifecycle.boom")
    def boom(message="boom"):
        raise ValueError(message)

    @app.task(shared=False, name="lifecycle.retry_once", bind=True, max_retries=3)
    def retry_once(self):
        if self.request.retries == 0:
            raise self.retry(countdown=0, exc=RuntimeError("first try always fails"))
        return self.request.retries

    @app.task(shared=False, name="lifecycle.sleep_for")
    def sleep_for(seconds):
        time.sleep(seconds)
        return seconds

    @app.task(shared=False, name="lifecycle.ledger_sleep", bind=True, max_retries=3)
    def ledger_sleep(self, ledger, seconds, retried_seconds=None):
        """Writes 'start' and 'done' lines to a file, so tests can count real runs.

        With ``retried_seconds``, a try published again (``retries`` > 0) sleeps that
        long instead: a test that kills the first try need not wait as long for the next.
        """
        _append(ledger, f"start try={self.request.retries + 1} pid={os.getpid()}")
        retried = retried_seconds is not None and self.request.retries > 0
        time.sleep(retried_seconds if retried else seconds)
        _append(ledger, f"done try={self.request.retries + 1} pid={os.getpid()}")
        return seconds

    @app.task(
        shared=False,
        name="lifecycle.ledger_sleep_once",
        bind=True,
        max_retries=0,
        base=LedgerTask,
    )
    def ledger_sleep_once(self, ledger, seconds):
        _append(ledger, f"start try={self.request.retries + 1} pid={os.getpid()}")
        time.sleep(seconds)
        return seconds

    def killable(self, ledger, seconds):
        """Long on its first try (the one a test kills by its pid), short once retried."""
        try_number = self.request.retries + 1
        _append(ledger, f"start try={try_number} pid={os.getpid()}")
        time.sleep(seconds if try_number == 1 else 0)
        _append(ledger, f"done try={try_number} pid={os.getpid()}")
        return try_number

    @app.task(shared=False, name="lifecycle.slow_first_start", bind=True)
    def slow_first_start(self, ledger, seconds, later_seconds):
        """Sleeps ``seconds`` on its first start and ``later_seconds`` on any later one,
        whatever the try: a redelivery of the same try after a kill is quick too."""
        first = not os.path.exists(ledger)
        _append(ledger, f"start try={self.request.retries + 1} pid={os.getpid()}")
        time.sleep(seconds if first else later_seconds)
        _append(ledger, f"done try={self.request.retries + 1} pid={os.getpid()}")
        return seconds

    # A pool process killed mid-task: Celery's three ways of handling it.
    for suffix, options in (
        ("", {}),
        ("_quiet", {"ignore_result": True}),
        ("_retried", {"retry_on_worker_lost": True, "default_retry_delay": 0}),
    ):
        app.task(
            shared=False,
            name=f"lifecycle.killable{suffix}",
            bind=True,
            base=LedgerTask,
            max_retries=2,
            **options,
        )(killable)

    @app.task(
        shared=False,
        name="lifecycle.poison",
        bind=True,
        base=LedgerTask,
        max_retries=2,
        acks_late=True,
        reject_on_worker_lost=True,
    )
    def poison(self, ledger):
        """Kills its own process, as a task the OOM killer always picks would."""
        _append(ledger, f"start try={self.request.retries + 1} pid={os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(shared=False, name="lifecycle.self_kill", bind=True, base=LedgerTask, max_retries=2)
    def self_kill(self, ledger):
        """Kills its own pool process on every run, with early acknowledgement.

        Not at once: a process killed before the worker's main process has read that it
        accepted the job has the job put back into another process by the pool (plain
        Celery runs it twice too); this test task is about a death mid-body."""
        _append(ledger, f"start try={self.request.retries + 1} pid={os.getpid()}")
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)

    # Time limits: each runs far past its limit on every try.
    for name, options in (
        ("hard_limited", {"time_limit": 1}),
        ("soft_limited", {"soft_time_limit": 1, "time_limit": 30}),
        ("hard_limited_late", {"time_limit": 1, "acks_late": True, "reject_on_worker_lost": True}),
    ):
        app.task(
            shared=False,
            name=f"lifecycle.{name}",
            bind=True,
            base=LedgerTask,
            max_retries=2,
            **options,
        )(_overrun)

    @app.task(shared=False, name="lifecycle.spawn", bind=True)
    def spawn(self, ledger, child_id):
        """Publishes a child that ends this whole worker as it starts, and waits to die.

        Its recovered try returns at once: the child was sent already, and a sleeping
        retry would hold a one-process survivor away from the child it must recover."""
        if self.request.retries:
            return "sent before"
        app.tasks["lifecycle.end_worker_once"].apply_async((ledger,), task_id=child_id)
        time.sleep(30)

    @app.task(shared=False, name="lifecycle.end_worker_once", bind=True, max_retries=3)
    def end_worker_once(self, ledger):
        """SIGKILLs its whole worker (a lost node) the moment its first try starts."""
        try_number = self.request.retries + 1
        _append(ledger, f"start try={try_number} pid={os.getpid()}")
        if try_number == 1:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return try_number

    @app.task(shared=False, name="lifecycle.dies_after_next_step", bind=True, max_retries=3)
    def dies_after_next_step(self, ledger):
        """A chain step whose first run dies once the rest of its chain ran, before its own
        outcome is stored (see :func:`_end_worker_once_the_chain_ran`)."""
        _append(ledger, f"first try={self.request.retries + 1} pid={os.getpid()}")
        return ledger

    @app.task(shared=False, name="lifecycle.next_step", bind=True, max_retries=3)
    def next_step(self, ledger, tag="next"):
        _append(ledger, f"{tag} try={self.request.retries + 1} pid={os.getpid()}")
        return ledger

    @app.task(shared=False, name="lifecycle.gather", bind=True, max_retries=3)
    def gather(self, results, ledger):
        """A chord body: counts its runs in the ledger."""
        _append(ledger, f"gather try={self.request.retries + 1} pid={os.getpid()}")
        return ledger

    @app.task(shared=False, name="lifecycle.sends_then_retries", bind=True, max_retries=3)
    def sends_then_retries(self, ledger, child_id):
        """Sends a child under a set id, and on its first try retries once the child ran."""
        _append(ledger, f"parent try={self.request.retries + 1} pid={os.getpid()}")
        child = next_step.apply_async((ledger,), {"tag": "child"}, task_id=child_id)
        if self.request.retries == 0:
            deadline = time.monotonic() + 20
            while not child.ready() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise self.retry(countdown=0)
        return "done"

    after_task_publish.connect(
        _end_worker_once_the_chain_ran, weak=False, dispatch_uid="lifecycle.the_chain_ran"
    )

    @app.task(shared=False, name="lifecycle.slow_first_try", bind=True, max_retries=3)
    def slow_first_try(self, first_seconds, later_seconds):
        """Long on its first try (the one a test kills), short once recovered."""
        time.sleep(first_seconds if self.request.retries == 0 else later_seconds)
        return self.request.retries + 1

    @app.task(shared=False, name="lifecycle.charge", bind=True, max_retries=3)
    @recoverable(idempotency_key="charge:{order_id}", lock_ttl=10, retry_countdown=0.2)
    def charge(self, ledger, order_id, seconds=0.3):
        """A side effect that must happen once per order: a row in a unique table."""
        _append(ledger, f"run {order_id} token={current_fencing_token()} pid={os.getpid()}")
        # Long only on a first try (the one a test may kill); short once recovered.
        time.sleep(seconds if self.request.retries == 0 else 0.3)
        return {"order": order_id, "token": current_fencing_token()}

    @app.task(shared=False, name="lifecycle.charge_row", bind=True)
    @recoverable(idempotency_key="row:{order_id}", retry_countdown=0.2)
    def charge_row(self, dsn, order_id):
        """The side effect is a row in a PostgreSQL table whose order_id is unique."""
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO charges (order_id, token) VALUES (%s, %s)",
                (order_id, current_fencing_token()),
            )
        time.sleep(0.2)
        return {"order": order_id, "token": current_fencing_token()}

    @app.task(
        shared=False,
        name="lifecycle.flaky_charge",
        bind=True,
        autoretry_for=(ValueError,),
        retry_kwargs={"countdown": 0.1, "max_retries": 3},
    )
    @recoverable(idempotency_key="flaky:{order_id}", retry_countdown=0.2)
    def flaky_charge(self, ledger, order_id):
        """Fails its first try with a ValueError, which autoretry_for retries."""
        token = current_fencing_token()
        _append(ledger, f"run {order_id} try={self.request.retries + 1} token={token}")
        if self.request.retries == 0:
            raise ValueError("the first attempt fails")
        return {"order": order_id, "token": token}

    @app.task(shared=False, name="lifecycle.charge_briefly", bind=True)
    @recoverable(idempotency_key="brief:{order_id}", result_ttl=1.5, retry_countdown=0.2)
    def charge_briefly(self, ledger, order_id):
        _append(ledger, f"run {order_id}")
        return order_id

    @app.task(shared=False, name="lifecycle.wait", bind=True, base=LedgerTask, max_retries=0)
    def wait(self, ledger, seconds, queue="default", end=False, block=0.0, timeout=None):
        """Defers on a Sleep trigger; resumes in the module's ``resumed``."""
        _append(ledger, f"start {self.request.id} pid={os.getpid()}")
        trigger = triggers.Sleep(triggers.due_in(seconds), queue=queue, end=end, block=block)
        defer(trigger, method_name="resumed", kwargs={"ledger": ledger}, timeout=timeout)

    @app.task(shared=False, name="lifecycle.wait_on", bind=True, base=LedgerTask, max_retries=0)
    def wait_on(self, ledger, kind, timeout=None):
        """Defers on one of the failing triggers (``Explodes``, ``Never``, ``Missing``...)."""
        defer(
            getattr(triggers, kind)(),
            method_name="resumed",
            kwargs={"ledger": ledger},
            timeout=timeout,
        )

    @app.task(shared=False, name="lifecycle.follow", bind=True)
    def follow(self, ledger, other_id, end=False):
        """Waits for another task's result in the triggerer, holding no worker slot."""
        trigger = TaskResultTrigger(other_id, poll=0.2, end_from_trigger=end)
        if end:
            defer(trigger)
        defer(trigger, method_name="resumed", kwargs={"ledger": ledger})

    @app.task(shared=False, name="lifecycle.nap", bind=True)
    @recoverable
    def nap(self, seconds):
        """A bare TimeDeltaTrigger that completes the task from the triggerer."""
        defer(TimeDeltaTrigger(seconds, end_from_trigger=True, result={"slept": seconds}))

    @app.task(shared=False, name="lifecycle.measure", max_retries=3)
    def measure(blob, seconds=0.0):
        """Takes a large argument (tests of oversized arguments); returns its length."""
        time.sleep(seconds)
        return len(blob)

    @app.task(shared=False, name="lifecycle.describe", serializer="pickle")
    def describe(value):
        return repr(value)

    def beats_then_hangs(self, ledger, hang=60.0):
        """Beats twice then hangs on its first try; later tries say where they resumed."""
        try_number = self.request.retries + 1
        resumed = heartbeat_details()
        _append(ledger, f"start try={try_number} resumed={json.dumps(resumed)} pid={os.getpid()}")
        if try_number == 1:
            heartbeat({"step": 1})
            heartbeat({"step": 2})
            time.sleep(hang)
        _append(ledger, f"done try={try_number}")
        return resumed

    for suffix, retries in (("", 2), ("_once", 0)):
        app.task(
            shared=False,
            name=f"lifecycle.beats_then_hangs{suffix}",
            bind=True,
            base=LedgerTask,
            max_retries=retries,
            recovery_heartbeat_timeout=3,
        )(beats_then_hangs)

    @app.task(
        shared=False,
        name="lifecycle.always_hangs",
        bind=True,
        base=LedgerTask,
        max_retries=None,
        recovery_heartbeat_timeout=2,
    )
    def always_hangs(self, ledger):
        """A poison task for hangs: every try beats once and hangs."""
        _append(ledger, f"start try={self.request.retries + 1} pid={os.getpid()}")
        heartbeat()
        time.sleep(60)

    @app.task(shared=False, name="lifecycle.steps", bind=True, max_retries=3)
    def steps(self, ledger, count=20, seconds=0.2):
        """Twenty steps, each beating its progress; a later try resumes after the last one."""
        start = (heartbeat_details() or {}).get("done", 0)
        _append(ledger, f"try={self.request.retries + 1} from={start} pid={os.getpid()}")
        for step in range(start, count):
            time.sleep(seconds)
            _append(ledger, f"step {step} try={self.request.retries + 1}")
            heartbeat({"done": step + 1})
        return start

    @app.task(shared=False, name="lifecycle.reject_once", bind=True, acks_late=True)
    def reject_once(self):
        """Sends its message back to the queue on the first delivery (Celery's own test)."""
        if not self.request.delivery_info.get("redelivered"):
            raise Reject(requeue=True)
        return "second delivery"

    @app.task(
        shared=False, name="lifecycle.reject_for_good", bind=True, acks_late=True, base=LedgerTask
    )
    def reject_for_good(self, ledger):
        """Drops its own message: Reject(requeue=False)."""
        _append(ledger, f"start try={self.request.retries + 1} pid={os.getpid()}")
        raise Reject("not wanted", requeue=False)


if os.environ.get("RECOVERY_TEST_HOSTNAME"):
    # Tests run every worker on one machine; this one pretends to be on its own host.
    import socket

    from celery_recovery.liveness import process as _process

    _fake_host = os.environ["RECOVERY_TEST_HOSTNAME"]
    socket.gethostname = lambda: _fake_host
    # Its process ids, too, mean nothing to a sweep elsewhere: without this the test's
    # own sweep, on the real host, would see the process gone before a real one could.
    _process._view = lambda: f"{_fake_host}-boot/pid:[1]"

app = create_app(
    os.environ.get("RECOVERY_TEST_BROKER", "redis://127.0.0.1:6379/9"),
    os.environ.get("RECOVERY_TEST_BACKEND", "redis://127.0.0.1:6379/10"),
    os.environ.get("RECOVERY_TEST_QUEUE", "celery"),
    None if os.environ.get("RECOVERY_TEST_PLAIN", "1") == "1" else {},
    acks_late=os.environ.get("RECOVERY_TEST_ACKS_LATE") == "1",
    reject_on_worker_lost=os.environ.get("RECOVERY_TEST_REJECT_ON_LOST") == "1",
    visibility_timeout=(
        float(os.environ["RECOVERY_TEST_VISIBILITY"])
        if os.environ.get("RECOVERY_TEST_VISIBILITY")
        else None
    ),
    prefetch_multiplier=int(os.environ.get("RECOVERY_TEST_PREFETCH") or 1),
    sqs_wait_time=int(os.environ.get("RECOVERY_TEST_SQS_WAIT") or SQS_WAIT_TIME),
)
if os.environ.get("RECOVERY_TEST_LISTENER_LOG"):
    log_failure_listeners(app, os.environ["RECOVERY_TEST_LISTENER_LOG"])
if os.environ.get("RECOVERY_TEST_BACKEND_RETRIES"):
    # Celery retries an unreachable Redis result backend for ~20 s before it gives up.
    app.conf.result_backend_transport_options = {
        "retry_policy": {"max_retries": int(os.environ["RECOVERY_TEST_BACKEND_RETRIES"])}
    }
if os.environ.get("RECOVERY_TEST_BEAT_INTERVAL"):
    from celery_recovery.beat_schedules import recovery_beat_schedule

    app.conf.beat_schedule = recovery_beat_schedule(
        sweep_interval=float(os.environ["RECOVERY_TEST_BEAT_INTERVAL"])
    )
app.set_current()
