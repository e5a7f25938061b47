"""@recoverable with real workers and real Redis: side effects happen once."""

from __future__ import annotations

import uuid

import pytest

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from tests.proxy import TcpProxy
from tests.services import BROKER_DB
from tests.sweeps.helpers import ledger_lines
from tests.workers import wait_for

pytestmark = pytest.mark.slow


def runs(ledger, order_id):
    return [line for line in ledger_lines(ledger) if line.startswith(f"run {order_id}")]


def test_fifty_deliveries_of_one_key_run_the_body_once(client_app, store, start_worker, tmp_path):
    ledger = tmp_path / "ledger"
    order = f"order-{uuid.uuid4().hex[:8]}"
    start_worker(name="a", concurrency=4)
    start_worker(name="b", concurrency=4)
    results = [client_app.send_task("lifecycle.charge", (str(ledger), order)) for _ in range(50)]
    values = [r.get(timeout=90) for r in results]
    assert len(runs(ledger, order)) == 1, ledger_lines(ledger)
    # Waiting for the holder is not a retry: every delivery stays its first try.
    assert recovery_for_app(client_app).flush()
    wait_for(
        lambda: all([t["try_number"] for t in store.tries.history(r.id)] == [1] for r in results),
        10,
        what="one try per delivery",
    )
    assert all(v == values[0] for v in values) and values[0]["order"] == order
    token = values[0]["token"]
    assert isinstance(token, int) and token > 0
    # The record of the try that ran shows its key and token.
    assert recovery_for_app(client_app).flush()
    ran = wait_for(
        lambda: [
            t
            for r in results
            for t in store.tries.history(r.id)
            if t["fencing_token"] == token and t["state"] == TaskState.SUCCESS
        ],
        10,
        what="the record with the token",
    )
    assert ran[0]["idempotency_key"] == f"charge:{order}"


def test_autoretry_for_retries_a_failed_attempt_with_a_newer_token_then_remembers_it(
    client_app, store, start_worker, tmp_path
):
    ledger = tmp_path / "ledger"
    order = f"flaky-{uuid.uuid4().hex[:8]}"
    start_worker(concurrency=2)
    first = client_app.send_task("lifecycle.flaky_charge", (str(ledger), order))
    value = first.get(timeout=30)
    [failed_run, good_run] = runs(ledger, order)
    tokens = [int(line.rsplit("token=", 1)[1]) for line in (failed_run, good_run)]
    assert "try=1" in failed_run and "try=2" in good_run
    assert tokens[0] < tokens[1] == value["token"]  # the failure released the key
    # A later delivery of the same key returns the remembered result, body not run.
    again = client_app.send_task("lifecycle.flaky_charge", (str(ledger), order))
    assert again.get(timeout=30) == value
    assert len(runs(ledger, order)) == 2
    tries = wait_for(
        lambda: (
            [(t["try_number"], t["state"]) for t in store.tries.history(first.id)]
            == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.SUCCESS)]
        ),
        10,
        what="try 1 up_for_retry and try 2 success",
    )
    assert tries


def test_completed_key_returns_its_result_until_result_ttl_passes(
    client_app, start_worker, tmp_path
):
    ledger = tmp_path / "ledger"
    order = f"brief-{uuid.uuid4().hex[:8]}"
    start_worker(concurrency=1)
    first = client_app.send_task("lifecycle.charge_briefly", (str(ledger), order)).get(timeout=20)
    again = client_app.send_task("lifecycle.charge_briefly", (str(ledger), order)).get(timeout=20)
    assert first == again == order
    assert len(runs(ledger, order)) == 1
    # result_ttl is 1.5 s: after it the key is forgotten and the body runs again.
    wait_for(
        lambda: (
            client_app.send_task("lifecycle.charge_briefly", (str(ledger), order)).get(timeout=20)
            and len(runs(ledger, order)) == 2
        ),
        15,
        interval=0.5,
        what="the result to expire",
    )


def test_redis_unreachable_by_default_does_not_run_then_completes(
    client_app, start_worker, tmp_path, broker_urls
):
    proxy = TcpProxy("127.0.0.1", 6379).start()
    locks_url = f"redis://127.0.0.1:{proxy.port}/{BROKER_DB}"
    ledger = tmp_path / "ledger"
    order = f"down-{uuid.uuid4().hex[:8]}"
    proxy.cut()
    worker = start_worker(concurrency=1, env={"CELERY_RECOVERY_REDIS_URL": locks_url})
    result = client_app.send_task("lifecycle.charge", (str(ledger), order))
    wait_for(lambda: "not run, retried in" in worker.log, 20, what="the refusal to run unguarded")
    assert runs(ledger, order) == []
    # Waiting again, not started: a STARTED left by this live worker would make the
    # sweeps take the postponed try for a running one, and never recover its message.
    wait_for(lambda: result.state == "PENDING", 5, what="the postponed try to read PENDING")
    proxy.start()
    assert result.get(timeout=30)["order"] == order
    assert len(runs(ledger, order)) == 1
    proxy.cut()


# The broker's and the lock's behaviour under test do not depend on the store:
# one store keeps the suite's time for the cases that do.
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_killed_holder_blocks_until_its_lease_expires_then_a_higher_token_runs(
    client_app, store, start_worker, tmp_path
):
    from tests.sweeps.helpers import sweep_until

    ledger = tmp_path / "ledger"
    order = f"kill-{uuid.uuid4().hex[:8]}"
    doomed = start_worker(name="doomed", concurrency=1)
    result = client_app.send_task("lifecycle.charge", (str(ledger), order, 60))
    wait_for(lambda: runs(ledger, order), 20, what="the first attempt to hold the key")
    start_worker(name="survivor", concurrency=2)
    doomed.kill()
    # The sweep re-publishes the try; the key stays held until the dead holder's
    # 10 s lease runs out, then the new attempt runs with a higher token.
    sweep_until(client_app, result.ready, 60, "the re-published attempt to complete")
    value = result.get(timeout=5)
    first_token = int(runs(ledger, order)[0].split("token=")[1].split()[0])
    assert value["token"] > first_token
    assert len(runs(ledger, order)) == 2  # the killed attempt and the one that completed


def test_side_effect_row_in_postgres_is_written_once(pg_url, make_client_app, start_worker):
    import psycopg

    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS charges (order_id text UNIQUE, token bigint)")
    order = f"row-{uuid.uuid4().hex[:8]}"
    client = make_client_app(pg_url)
    start_worker(store_url=pg_url, name="a", concurrency=4)
    start_worker(store_url=pg_url, name="b", concurrency=4)
    results = [client.send_task("lifecycle.charge_row", (dsn, order)) for _ in range(50)]
    values = [r.get(timeout=90) for r in results]  # a second INSERT would fail its task
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT token FROM charges WHERE order_id = %s", (order,)).fetchall()
        conn.execute("DROP TABLE charges")
    assert len(rows) == 1
    assert all(v == values[0] for v in values) and values[0]["token"] == rows[0][0]
