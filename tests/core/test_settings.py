"""Settings are read from app.conf, the environment and overrides, and bad ones are refused."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery

from celery_recovery import ConfigurationError, Recovery, RecoverySettings


def settings(conf=None, environ=None, **overrides):
    return RecoverySettings.from_sources(conf or {}, environ or {}, overrides)


def test_defaults_match_the_design():
    s = settings()
    assert s.database_url == "sqlite:///celery_recovery.sqlite3"
    assert (s.heartbeat_interval, s.zombie_threshold, s.health_check_threshold) == (5, 30, 30)
    assert (s.sweep_interval, s.queued_timeout, s.adoption_timeout) == (5, 600, 600)
    assert s.redis_url is None


def test_precedence_conf_then_environment_then_overrides():
    conf = {"recovery_zombie_threshold": 40, "recovery_queued_timeout": 100}
    environ = {"CELERY_RECOVERY_ZOMBIE_THRESHOLD": "50"}
    s = settings(conf, environ, queued_timeout=timedelta(minutes=3))
    assert s.zombie_threshold == 50
    assert s.queued_timeout == 180


def test_redis_url_defaults_to_a_redis_broker_only():
    s = RecoverySettings.from_sources({}, {}, {}, broker_url="redis://cache:6379/0")
    assert s.redis_url == "redis://cache:6379/0"
    s = RecoverySettings.from_sources({}, {}, {}, broker_url="amqp://guest@rabbit//")
    assert s.redis_url is None


def test_postgres_urls_are_pinned_to_psycopg3():
    s = settings(database_url="postgresql://u:pw@db/recovery")
    assert s.database_url.startswith("postgresql+psycopg://")
    assert "pw" not in s.masked_database_url and "pw" not in repr(s)


def test_zombie_threshold_under_three_heartbeats_is_refused():
    with pytest.raises(ConfigurationError) as err:
        settings(heartbeat_interval=5, zombie_threshold=10)
    message = str(err.value)
    assert "recovery_zombie_threshold=10s" in message
    assert "recovery_heartbeat_interval=5s" in message and "at least 15s" in message


def test_health_check_threshold_under_three_heartbeats_is_refused():
    with pytest.raises(ConfigurationError, match="recovery_health_check_threshold=4s"):
        settings(heartbeat_interval=2, health_check_threshold=4)


@pytest.mark.parametrize("value", [0, -1, "soon", float("nan"), True, [5]])
def test_non_positive_or_non_numeric_interval_is_refused(value):
    with pytest.raises(ConfigurationError) as err:
        settings(heartbeat_interval=value)
    assert "recovery_heartbeat_interval" in str(err.value)
    assert repr(value) in str(err.value)


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigurationError, match="CELERY_RECOVERY_SWEEP_INTERVAL='often'"):
        settings(environ={"CELERY_RECOVERY_SWEEP_INTERVAL": "often"})


def test_sweep_interval_longer_than_zombie_threshold_is_refused():
    with pytest.raises(ConfigurationError, match="recovery_sweep_interval=60s"):
        settings(sweep_interval=60)


def test_sweep_interval_longer_than_health_check_threshold_is_refused():
    # Orphaned triggers of a dead triggerer would wait longer than the threshold says.
    with pytest.raises(
        ConfigurationError, match="recovery_health_check_threshold=20s: dead beats and triggerers"
    ):
        settings(sweep_interval=25, zombie_threshold=60, health_check_threshold=20)


def test_unknown_setting_suggests_the_near_match():
    with pytest.raises(ConfigurationError) as err:
        settings({"recovery_zombie_treshold": 40})
    assert "'recovery_zombie_treshold'" in str(err.value)
    assert "did you mean 'recovery_zombie_threshold'" in str(err.value)


def test_unknown_override_and_environment_names_are_refused():
    with pytest.raises(ConfigurationError, match="did you mean 'recovery_heartbeat_interval'"):
        settings(heartbeat_intervall=1)
    with pytest.raises(ConfigurationError, match="CELERY_RECOVERY_DATABASE"):
        settings(environ={"CELERY_RECOVERY_DATABASE": "sqlite:///x.db"})


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://root:hunter2@db/recovery", "'mysql'"),
        ("postgresql+psycopg2://u@db/x", "'postgresql+psycopg2'"),
        ("sqlite://", "needs a file path"),
        ("not a url", "is not a database URL"),
    ],
)
def test_unsupported_database_url_is_refused(url, expected):
    with pytest.raises(ConfigurationError) as err:
        settings(database_url=url)
    assert "recovery_database_url" in str(err.value) and expected in str(err.value)
    assert "hunter2" not in str(err.value)


def test_recovery_reads_app_conf_and_refuses_bad_values(tmp_path):
    app = Celery("conf", broker="memory://", set_as_current=False)
    app.conf.recovery_database_url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    app.conf.recovery_heartbeat_interval = 1
    app.conf.recovery_zombie_threshold = 2
    with pytest.raises(ConfigurationError, match="recovery_zombie_threshold=2s"):
        Recovery(app)


def test_recovery_twice_on_one_app_changes_nothing(tmp_path):
    app = Celery("twice", broker="memory://", set_as_current=False)
    app.conf.recovery_database_url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    first = Recovery(app, zombie_threshold=45)
    try:
        second = Recovery(app, zombie_threshold=90)
        assert second is first
        assert second.settings.zombie_threshold == 45
    finally:
        first.close()


@pytest.mark.parametrize("name", ["default", "kubernetes", "aggressive"])
def test_every_preset_is_a_valid_configuration(name):
    from celery_recovery.beat_schedules import preset_settings

    s = settings(**preset_settings(name))
    assert s.zombie_threshold >= 3 * s.heartbeat_interval


def test_unknown_preset_lists_the_allowed_ones():
    from celery_recovery.beat_schedules import preset_settings

    with pytest.raises(ConfigurationError, match="'kubernetes'"):
        preset_settings("k8s")


def test_preset_sets_the_timing_defaults_and_explicit_settings_win():
    s = settings({"recovery_preset": "kubernetes", "recovery_sweep_interval": 1})
    assert (s.heartbeat_interval, s.zombie_threshold, s.sweep_interval) == (2, 10, 1)
    with pytest.raises(ConfigurationError, match="recovery_preset='fast'"):
        settings({"recovery_preset": "fast"})


@pytest.mark.parametrize("value", [-1, 1.5, "many", True])
def test_max_republish_must_be_a_whole_number(value):
    with pytest.raises(ConfigurationError, match="recovery_max_republish"):
        settings(max_republish=value)
