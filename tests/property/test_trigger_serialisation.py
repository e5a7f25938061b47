"""Any trigger kwargs or stored class path: a round trip, or DeferralError with a
clear one-line reason; never another exception and never an import of a refused path."""

from __future__ import annotations

import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from celery_recovery.core.errors import DeferralError
from celery_recovery.triggers.base import BaseTrigger, classpath_of
from celery_recovery.triggers.loading import TriggerLoadError, load_trigger, serialize_trigger
from tests.property.strategies import FAST, json_values, values

PREFIXES = ("celery_recovery", "tests")


class Echo(BaseTrigger):
    """Serialises whatever keyword arguments it was given."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(type(self)), self.kwargs


keys = st.text(max_size=10).filter(lambda k: k.isidentifier() and k != "self")


@FAST
@given(kwargs=st.dictionaries(keys, json_values, max_size=4))
def test_json_kwargs_round_trip(kwargs):
    classpath, stored = serialize_trigger(Echo(**kwargs), PREFIXES)
    rebuilt = load_trigger(classpath, stored, PREFIXES)
    assert isinstance(rebuilt, Echo) and rebuilt.kwargs == kwargs


@FAST
@given(kwargs=st.dictionaries(keys, values, max_size=4))
def test_any_kwargs_round_trip_or_are_refused_with_the_trigger_named(kwargs):
    try:
        classpath, stored = serialize_trigger(Echo(**kwargs), PREFIXES)
    except DeferralError as exc:
        assert "Echo kwargs must be JSON" in str(exc) and "\n" not in str(exc)
        return
    assert load_trigger(classpath, stored, PREFIXES).kwargs == kwargs


classpaths = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.sampled_from(
            [
                "celery_recovery",
                "tests",
                "os",
                "",
                ".",
                "..",
                "/",
                "__main__",
                "triggers",
                "temporal",
                "DateTimeTrigger",
                "x y",
                "\x00",
            ]
        ),
        min_size=1,
        max_size=6,
    ).map(".".join),
)


@FAST
@given(classpath=classpaths, kwargs=values)
def test_any_stored_class_path_loads_or_is_refused_without_importing_outside(classpath, kwargs):
    before = set(sys.modules)
    try:
        trigger = load_trigger(classpath, kwargs, PREFIXES)
    except TriggerLoadError as exc:
        assert len(str(exc)) < 1000
        refused_early = ("outside the allowed", "plain Python name", "'module.Class'", "over the")
        if any(reason in str(exc) for reason in refused_early):
            assert set(sys.modules) == before  # refused before any import
    else:
        assert isinstance(trigger, BaseTrigger)
