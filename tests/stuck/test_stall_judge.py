"""The stall verdict as pure logic: time passed in, no worker (the real ones are beside)."""

from __future__ import annotations

import pytest

from celery_recovery.core.consumer import ConsumerFacts, QueueProbe, StallJudge, stalled_reason
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.presets import PRESETS
from celery_recovery.core.settings import RecoverySettings

TIMEOUT = 10.0


def facts(last_received: float = 0.0, free: int = 2, connected: bool = True, since: float = 0.0):
    return ConsumerFacts(connected, since, last_received, 2 - free, 0, free)


def probed(judge: StallJudge, at: float, ready: int | None, error: str | None = None) -> None:
    judge.probe_started(at)
    judge.probed(QueueProbe(at, ready, error), last_received=0.0)


def test_an_idle_worker_with_empty_queues_is_never_stalled():
    judge = StallJudge(TIMEOUT, started=0.0)
    for second in range(0, 600, 3):
        if judge.probe_due(second, facts()):
            probed(judge, second, 0)
        assert judge.verdict(second, facts()) is None


def test_ready_messages_not_taken_for_the_timeout_are_a_stall():
    judge = StallJudge(TIMEOUT, started=0.0)
    probed(judge, 5.0, 3)
    assert judge.verdict(7.5, facts()) is None  # one look is not enough
    probed(judge, 7.5, 3)
    assert judge.verdict(9.0, facts()) is None  # nothing received for less than the timeout
    assert "3 ready messages" in judge.verdict(10.0, facts())


def test_a_queue_being_consumed_or_a_message_received_is_no_stall():
    judge = StallJudge(TIMEOUT, started=0.0)
    probed(judge, 5.0, 3)
    probed(judge, 7.5, 2)  # fewer: someone takes them
    probed(judge, 10.0, 2)
    assert judge.verdict(11.0, facts()) is None
    assert judge.verdict(20.0, facts(last_received=19.0)) is None


def test_a_busy_worker_is_never_asked_nor_stalled():
    judge = StallJudge(TIMEOUT, started=0.0)
    busy = facts(free=0)
    assert not judge.probe_due(100.0, busy)
    probed(judge, 5.0, None, "TimeoutError")  # an old failure, from before it got busy
    assert judge.verdict(100.0, busy) is None


def test_a_broker_that_does_not_answer_for_the_timeout_is_a_stall():
    judge = StallJudge(TIMEOUT, started=0.0)
    probed(judge, 2.5, 0)
    probed(judge, 5.0, None, "TimeoutError: timed out")
    assert judge.verdict(9.0, facts()) is None
    assert "broker not answering for 10s (TimeoutError" in judge.verdict(12.5, facts())
    # a probe hanging past its own timeout counts as unanswered too
    judge.probe_started(13.0)
    assert judge.verdict(13.0 + judge.probe_timeout, facts()) is not None


def test_a_connection_down_for_the_timeout_is_a_stall():
    judge = StallJudge(TIMEOUT, started=0.0)
    assert judge.verdict(9.0, facts(connected=False, since=0.0)) is None
    assert judge.verdict(10.0, facts(connected=False, since=0.0)) == (
        "broker connection down for 10s"
    )


def test_the_probe_reads_the_reason_a_worker_recorded():
    assert stalled_reason(None) is None
    assert stalled_reason({"stalled": False}) is None
    assert stalled_reason({"stalled": True, "stalled_reason": "why"}) == "why"


def test_every_preset_has_a_stall_timeout_within_the_promised_bounds():
    assert PRESETS["default"]["stalled_consumer_timeout"] <= 60
    assert PRESETS["aggressive"]["stalled_consumer_timeout"] <= 15
    assert all("stalled_consumer_timeout" in values for values in PRESETS.values())


def test_bad_stall_settings_are_refused_naming_the_setting():
    with pytest.raises(ConfigurationError, match=r"recovery_on_stalled_consumer='restart'.*'exit'"):
        RecoverySettings.from_sources(overrides={"on_stalled_consumer": "restart"})
    with pytest.raises(ConfigurationError, match="recovery_stalled_consumer_timeout=1s is shorter"):
        RecoverySettings.from_sources(overrides={"stalled_consumer_timeout": 1})
    settings = RecoverySettings.from_sources(overrides={"preset": "aggressive"})
    assert settings.stalled_consumer_timeout == 10.0 and settings.on_stalled_consumer == "report"
