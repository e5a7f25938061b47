"""Any value of any ``recovery_*`` setting parses, or is refused by a ConfigurationError
naming the setting: never another exception."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.settings import SETTINGS, RecoverySettings
from tests.property.strategies import FAST, values

KNOWN = [spec.conf_key for spec in SETTINGS]
names = st.one_of(
    st.sampled_from(KNOWN),
    st.sampled_from(KNOWN).map(str.upper),
    st.text(max_size=20).map(lambda s: "recovery_" + s),
)


def refused_by_name(conf: dict) -> None:
    try:
        RecoverySettings.from_sources(conf=conf, environ={})
    except ConfigurationError as exc:
        message = str(exc).lower()
        named = [k for k in conf if k.lower() in message or repr(k).lower() in message]
        assert named, (conf, str(exc))


@FAST
@given(name=names, value=values)
@example(name="recovery_max_republish", value=float("inf"))
@example(name="recovery_heartbeat_interval", value=10**400)
@example(name="recovery_triggerer_capacity", value="1e400")
@example(name="recovery_database_url", value="postgresql://u:p@h:99999999/db")
@example(name="recovery_redis_url", value="redis://h:-1/0")
def test_any_single_setting_parses_or_is_refused_naming_it(name, value):
    refused_by_name({name: value})


@FAST
@given(conf=st.dictionaries(st.sampled_from(KNOWN), values, min_size=2, max_size=4))
def test_any_combination_parses_or_is_refused_naming_one_of_them(conf):
    refused_by_name(conf)


@FAST
@given(name=st.sampled_from(KNOWN), value=st.text(max_size=30))
def test_environment_strings_parse_or_are_refused_naming_the_variable(name, value):
    variable = "CELERY_RECOVERY_" + name.removeprefix("recovery_").upper()
    try:
        RecoverySettings.from_sources(environ={variable: value})
    except ConfigurationError as exc:
        assert variable in str(exc) or "recovery_" in str(exc), str(exc)
