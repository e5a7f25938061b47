"""Any idempotency key template either works or is refused by a ConfigurationError
naming ``idempotency_key``: at decoration time, and when a key is built."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.locks.keys import build_key, check_template
from tests.property.strategies import FAST, json_values, values


def charge(order_id, amount=0, note=None):
    """A task body whose parameters the templates may name."""


fields = st.sampled_from(
    ["order_id", "amount", "note", "0", "", "missing", "order_id.real", "order_id[0]", "self"]
)
conversions = st.sampled_from(["", "!r", "!s", "!x", ":d", ":>10", ":%", ":.2f", ":{x}"])
templates = st.one_of(
    st.text(max_size=30),
    st.lists(
        st.one_of(
            st.text(alphabet="ab:{}!.[]", max_size=6),
            st.builds(lambda f, c: "{" + f + c + "}", fields, conversions),
        ),
        max_size=4,
    ).map("".join),
)


@FAST
@given(template=templates, args=st.lists(values, max_size=2), kwargs_note=values)
@example(template="{", args=[], kwargs_note=None)
@example(template="{order_id.__class__}", args=[1], kwargs_note=None)
@example(template="{order_id:d}", args=["x"], kwargs_note=None)
@example(template="{amount[9]}", args=[1, [1]], kwargs_note=None)
def test_a_template_works_or_is_refused_naming_the_option(template, args, kwargs_note):
    try:
        check_template(charge, template)
    except ConfigurationError as exc:
        assert "idempotency_key" in str(exc)
        return
    call_args = tuple(args[:2]) or (1,)
    try:
        key = build_key(charge, template, "shop.charge", call_args, {"note": kwargs_note})
    except ConfigurationError as exc:
        assert "idempotency_key" in str(exc) and "shop.charge" in str(exc)
        return
    assert isinstance(key, str)


@FAST
@given(args=st.lists(json_values, max_size=3), kwargs=st.dictionaries(st.text(), json_values))
def test_the_default_key_is_a_stable_hash_of_any_json_arguments(args, kwargs):
    first = build_key(charge, None, "shop.charge", tuple(args), kwargs)
    assert first == build_key(charge, None, "shop.charge", tuple(args), dict(kwargs))
    assert first.startswith("shop.charge:") and len(first) == len("shop.charge:") + 32


@FAST
@given(spec=values.filter(lambda v: not isinstance(v, str) and v is not None))
def test_a_spec_that_is_neither_template_nor_callable_is_refused(spec):
    try:
        check_template(charge, spec)
    except ConfigurationError as exc:
        assert "idempotency_key" in str(exc)
    else:
        raise AssertionError(f"{spec!r} accepted")
