"""Redis servers: eviction and persistence, for the broker, the backend and the locks;
and a broker visibility timeout shorter than the longest hold."""

from __future__ import annotations

from datetime import timedelta

import redis

from celery_recovery import recoverable
from celery_recovery.core.timeutils import utcnow
from celery_recovery.doctor import ExitStatus, Severity
from celery_recovery.store import Store
from tests.builders import add_try
from tests.doctor.helpers import finding, ids, make_app, run


def test_evicting_redis_without_persistence_is_named_with_its_fix(bad_redis, sqlite_url):
    app = make_app(f"{bad_redis.url}/0", f"{bad_redis.url}/1", sqlite_url)
    report = run(app)
    assert ids(report) == ["redis-eviction", "redis-not-persistent"]
    assert report.exit_status is ExitStatus.FINDINGS
    eviction = finding(report, "redis-eviction")
    assert eviction.severity is Severity.ERROR  # a maxmemory is set: it evicts today
    assert eviction.subject == f"redis 127.0.0.1:{bad_redis.port} (broker, result backend)"
    assert "maxmemory-policy is allkeys-lru" in eviction.problem
    assert "reads PENDING and may run a finished task again" in eviction.problem  # backend
    assert f"redis-cli -h 127.0.0.1 -p {bad_redis.port} CONFIG SET maxmemory-policy noeviction" in (
        eviction.fix
    )
    assert "CONFIG SET appendonly yes" in finding(report, "redis-not-persistent").fix

    # Applying the fixes they give removes both findings.
    client = redis.Redis(port=bad_redis.port)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("appendonly", "yes")
    assert ids(run(app)) == []


def test_well_configured_redis_passes(good_redis, sqlite_url):
    report = run(make_app(f"{good_redis.url}/0", f"{good_redis.url}/1", sqlite_url))
    assert report.findings == [] and report.unknowns == []
    assert report.exit_status is ExitStatus.NOTHING_FOUND
    assert any("maxmemory-policy noeviction" in line for line in report.read)


def test_a_redis_with_rdb_save_points_counts_as_persistent(bad_redis, sqlite_url):
    redis.Redis(port=bad_redis.port).config_set("save", "900 1")
    assert "redis-not-persistent" not in ids(run(make_app(f"{bad_redis.url}/0", None, sqlite_url)))


def test_the_locks_redis_is_read_when_a_task_is_recoverable(good_redis, bad_redis, sqlite_url):
    app = make_app(
        f"{good_redis.url}/0",
        f"{good_redis.url}/1",
        sqlite_url,
        recovery_redis_url=f"{bad_redis.url}/2",
    )
    assert ids(run(app)) == []  # no task takes a lock: that Redis does not matter

    @app.task(shared=False, name="shop.charge")
    @recoverable(idempotency_key="charge:{order_id}")
    def charge(order_id):
        return order_id

    eviction = finding(run(app), "redis-eviction")
    assert eviction.subject == f"redis 127.0.0.1:{bad_redis.port} (idempotency locks)"
    assert "@recoverable task runs twice" in eviction.problem


def test_a_broker_that_does_not_answer_cannot_be_told(closed_port, sqlite_url):
    report = run(make_app(f"redis://127.0.0.1:{closed_port}/0", "db+sqlite:///r.db", sqlite_url))
    assert report.exit_status is ExitStatus.CANNOT_TELL
    [unknown] = report.unknowns
    assert unknown.check == "redis" and f"127.0.0.1:{closed_port} (broker)" in unknown.subject
    assert "did not answer" in unknown.reason


def test_visibility_timeout_shorter_than_an_acks_late_time_limit(good_redis, sqlite_url):
    app = make_app(
        f"{good_redis.url}/0",
        f"{good_redis.url}/1",
        sqlite_url,
        broker_transport_options={"visibility_timeout": 60},
    )

    @app.task(shared=False, name="shop.export", acks_late=True, time_limit=120)
    def export():
        return None

    @app.task(
        shared=False, name="shop.quick", time_limit=600
    )  # acked early: the timeout does not matter
    def quick():
        return None

    short = finding(run(app), "visibility-timeout-short")
    assert "time_limit=120s of the acks_late task shop.export" in short.problem
    assert "visibility_timeout of 60s (broker_transport_options)" in short.problem
    assert short.fix.startswith("app.conf.broker_transport_options = {'visibility_timeout': 180}")

    app.conf.broker_transport_options = {"visibility_timeout": 180}
    assert ids(run(app)) == []


def test_time_limits_from_config_and_annotations_count(good_redis, sqlite_url):
    app = make_app(
        f"{good_redis.url}/0",
        f"{good_redis.url}/1",
        sqlite_url,
        task_acks_late=True,
        task_annotations={"shop.report": {"time_limit": 5400}},
    )

    @app.task(shared=False, name="shop.report")
    def report_task():
        return None

    short = finding(run(app), "visibility-timeout-short")
    assert "time_limit=5400s of the acks_late task shop.report" in short.problem
    assert "3600s (kombu's default)" in short.problem


def test_eta_horizon_from_the_store_or_the_setting(good_redis, sqlite_url):
    app = make_app(f"{good_redis.url}/0", f"{good_redis.url}/1", sqlite_url)
    store = Store(sqlite_url)
    store.ensure_ready()
    now = utcnow()
    add_try(store, "queued", task_name="shop.remind", queued_at=now, eta=now + timedelta(hours=2))
    store.dispose()
    short = finding(run(app), "visibility-timeout-short")
    assert "the farthest ETA of a queued task in the store (shop.remind, 7200s" in short.problem

    declared = make_app(
        f"{good_redis.url}/0",
        f"{good_redis.url}/1",
        sqlite_url,
        recovery_longest_eta=timedelta(days=1),
    )
    assert (
        "recovery_longest_eta=86400s" in finding(run(declared), "visibility-timeout-short").problem
    )


def test_an_sqs_visibility_timeout_is_read_from_the_settings(sqlite_url):
    """SQS: the doctor reads kombu's options (it does not call AWS)."""
    app = make_app("sqs://key:secret@127.0.0.1:1", "db+sqlite:///r.db", sqlite_url)

    @app.task(shared=False, name="shop.resize", acks_late=True, time_limit=2400)
    def resize():
        return None

    short = finding(run(app), "visibility-timeout-short")
    assert "visibility_timeout of 1800s (kombu's default)" in short.problem
    assert short.subject == "broker sqs://key:***@127.0.0.1:1"
    app.conf.broker_transport_options = {"visibility_timeout": 3600}
    assert ids(run(app)) == []


def test_a_user_the_acl_forbids_info_and_config_cannot_tell(good_redis, sqlite_url):
    """The locks' least-privileged user (docs/security.md) may not read the server."""
    admin = redis.Redis(port=good_redis.port)
    admin.execute_command(
        "ACL", "SETUSER", "locks", "on", ">pw", "~*", "-@all", "+get", "+set", "+ping"
    )
    app = make_app(
        f"redis://locks:pw@127.0.0.1:{good_redis.port}/0", "db+sqlite:///r.db", sqlite_url
    )
    report = run(app)
    [unknown] = report.unknowns
    assert unknown.reason.startswith("refused the doctor: ") and "pw" not in unknown.reason
    assert unknown.fix == "let the URL's user run INFO and CONFIG GET (ACL: +info +config|get)"
    assert report.exit_status is ExitStatus.CANNOT_TELL


def test_without_config_the_policy_is_read_from_info(bad_redis, sqlite_url):
    """A managed Redis that refuses CONFIG: INFO still tells the eviction policy, not the
    RDB save points."""
    admin = redis.Redis(port=bad_redis.port)
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "~*", "-@all", "+info")
    app = make_app(
        f"redis://reader:pw@127.0.0.1:{bad_redis.port}/0", "db+sqlite:///r.db", sqlite_url
    )
    report = run(app)
    assert ids(report) == ["redis-eviction"]
    assert "maxmemory-policy is allkeys-lru with maxmemory 67108864 bytes" in (
        finding(report, "redis-eviction").problem
    )
    [unknown] = report.unknowns
    assert "the RDB save points cannot be read (CONFIG is not allowed)" in unknown.reason
