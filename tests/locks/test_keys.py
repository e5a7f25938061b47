"""Idempotency keys and decorator options (pure logic)."""

from __future__ import annotations

import pytest

from celery_recovery import ConfigurationError, recoverable
from celery_recovery.locks.keys import build_key


def charge(self, order_id, currency="EUR"):
    """Charge an order."""


def test_template_binds_positional_and_default_arguments():
    assert build_key(charge, "charge:{order_id}:{currency}", "t", (None, 7), {}) == "charge:7:EUR"
    assert build_key(charge, "c:{order_id}", "t", (None,), {"order_id": 9}) == "c:9"


def test_callable_gets_the_same_arguments():
    assert build_key(charge, lambda self, order_id, **_: f"x{order_id}", "t", (None, 3), {}) == "x3"


def test_default_key_is_the_task_name_and_a_stable_hash():
    a = build_key(charge, None, "shop.charge", (1,), {"b": [1, 2]})
    b = build_key(charge, None, "shop.charge", (1,), {"b": [1, 2]})
    c = build_key(charge, None, "shop.charge", (2,), {"b": [1, 2]})
    assert a == b != c and a.startswith("shop.charge:")


def test_default_key_of_a_bound_task_leaves_the_task_out():
    class Task:  # a task instance differs per process; its hash must not
        pass

    first, second = Task(), Task()
    a = build_key(charge, None, "shop.charge", (first, 1), {}, first)
    b = build_key(charge, None, "shop.charge", (second, 1), {}, second)
    assert a == b == build_key(charge, None, "shop.charge", (1,), {})


def test_template_naming_an_unknown_parameter_is_refused_at_decoration():
    with pytest.raises(ConfigurationError, match=r"'order'.*parameters: self, order_id, currency"):
        recoverable(idempotency_key="charge:{order}")(charge)


@pytest.mark.parametrize(
    ("option", "value"),
    [("lock_ttl", 0), ("result_ttl", -1), ("on_duplicate", "wait"), ("on_lock_error", "ignore")],
)
def test_bad_options_name_the_option(option, value):
    with pytest.raises(ConfigurationError, match=option):
        recoverable(**{option: value})


def test_the_decorator_keeps_name_signature_and_docstring():
    import inspect

    wrapped = recoverable(idempotency_key="c:{order_id}")(charge)
    assert wrapped.__name__ == "charge" and wrapped.__doc__ == "Charge an order."
    assert inspect.signature(wrapped) == inspect.signature(charge)
    assert recoverable(charge).__wrapped__ is charge
