"""Claim: Sentry events and metric labels carry no secrets
(docs/security.md, "Sentry and metrics carry no secrets")."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY, generate_latest

from celery_recovery.recovery import recovery_for_app
from celery_recovery.telemetry.metrics import definitions
from tests.builders import make_zombie
from tests.security.secret_app import SECRET
from tests.telemetry.test_sentry import CapturingTransport, capturing_sentry

sentry_sdk = pytest.importorskip("sentry_sdk")

ARGUMENT = "card-4111-1111-1111-1111"


@pytest.fixture
def transport() -> Iterator[CapturingTransport]:
    """The real sentry-sdk with its default integrations (logging breadcrumbs and events),
    and a stack trace attached to every message (sentry-sdk 3's default; 2's opt-in)."""
    yield from capturing_sentry(auto_enabling_integrations=False, attach_stacktrace=True)


@pytest.fixture
def secret_store_url(pg_url: str) -> str:
    """The test database through a URL with a password (local connections are trusted)."""
    url = pg_url.replace("postgres@", f"postgres:{SECRET}@")
    assert SECRET in url
    return url


def test_sentry_events_hold_no_arguments_and_no_password(
    make_client_app, secret_store_url, transport
):
    recovery = recovery_for_app(make_client_app(secret_store_url))
    task_id = f"z-{uuid.uuid4().hex[:8]}"
    make_zombie(recovery.store, task_id, args=(ARGUMENT, 1))

    assert recovery.sweep().republished == 1

    events = transport.items("event")
    assert [e["contexts"]["celery_recovery"]["task_id"] for e in events] == [task_id]
    sent = json.dumps([e for envelope in transport.envelopes for e in _payloads(envelope)])
    assert SECRET not in sent and ARGUMENT not in sent


def _payloads(envelope) -> list:
    return [item.payload.json for item in envelope.items if item.payload.json is not None]


def test_metric_labels_are_a_fixed_vocabulary_without_secrets(make_client_app, secret_store_url):
    recovery = recovery_for_app(make_client_app(secret_store_url))
    make_zombie(recovery.store, f"z-{uuid.uuid4().hex[:8]}", args=(ARGUMENT, 1))
    recovery.sweep()

    exposition = generate_latest(REGISTRY).decode()
    assert SECRET not in exposition and ARGUMENT not in exposition
    vocabulary = {
        *definitions.CAUSES,
        *definitions.ACTIONS,
        *definitions.CALLBACK_KINDS,
        *definitions.CALLBACK_OUTCOMES,
        *definitions.STORE_ERRORS,
        *definitions.LOCK_OUTCOMES,
        *definitions.JOB_TYPES,
        *definitions.TRIGGER_EVENT_KINDS,
        *definitions.BEAT_LEAD_CHANGES_KINDS,
        *definitions.BEAT_RUN_OUTCOMES,
        *definitions.SWEEP_STEPS,
        *definitions.MARKER_FINDERS,
        *definitions.MARKERS,
    }
    for line in exposition.splitlines():
        if not line.startswith(definitions.PREFIX):
            continue
        for name, value in re.findall(r'(\w+)="([^"]*)"', line):
            if name == "le":  # histogram buckets
                continue
            assert value in vocabulary, line
