"""Claim: a trigger row written by a hostile actor cannot execute code through its
class path (docs/security.md, "Trigger class paths").

Only ``module.Class`` paths made of plain names, under an allowed module
prefix, naming a :class:`BaseTrigger` subclass, are imported and built.  The
end-to-end case (a row pointed at ``os.system`` fails its task, the command
never runs) is ``tests/triggerer/test_triggers.py::
test_a_hostile_trigger_row_is_never_imported_and_fails_its_task``; the
outside-the-prefix cases are ``test_a_stored_class_path_is_imported_only_from_allowed_modules``
there.
"""

from __future__ import annotations

import sys

import pytest

from celery_recovery.triggers.loading import (
    MAX_CLASSPATH,
    TriggerLoadError,
    is_allowed,
    load_trigger,
)

PREFIXES = ("celery_recovery",)


@pytest.mark.parametrize(
    ("classpath", "message"),
    [
        ("celery_recovery..x", "not a plain Python name"),
        ("celery_recovery.", "not a plain Python name"),
        (".celery_recovery.triggers.temporal.DateTimeTrigger", "not a plain Python name"),
        ("..os.system", "not a plain Python name"),
        ("celery_recovery/../os.system", "not a plain Python name"),
        ("celery_recovery.triggers/../../os.system", "not a plain Python name"),
        ("celery_recovery.__main__.X", "not a plain Python name"),
        ("celery_recovery.triggers.__builtins__", "not a plain Python name"),
        ("celery_recovery.\x00.x", "not a plain Python name"),
        ("celery_recovery .x", "not a plain Python name"),
        ("celery_recovery.triggers.temporal.DateTimeTrigger()", "not a plain Python name"),
        ("celery_recovery;import os.x", "not a plain Python name"),
        ("celery_recovery." + "a." * 600 + "X", "over the 1000 allowed"),
        ("celery_recovery_evil.DateTimeTrigger", "outside the allowed modules"),
        ("celery_recoveryx.y.Z", "outside the allowed modules"),
        ("builtins.eval", "outside the allowed modules"),
        ("celery_recovery.triggers.base.BaseTrigger", "not a BaseTrigger subclass"),
        ("celery_recovery.triggers.loading.importlib", "not a BaseTrigger subclass"),
        ("celery_recovery.triggers.loading.load_trigger", "not a BaseTrigger subclass"),
        ("celery_recovery.core.errors.ConfigurationError", "not a BaseTrigger subclass"),
        (None, "is not 'module.Class'"),
        (42, "is not 'module.Class'"),
    ],
)
def test_trigger_class_paths_with_path_tricks_are_refused_before_any_import(classpath, message):
    before = set(sys.modules)
    with pytest.raises(TriggerLoadError, match=message) as refused:
        load_trigger(classpath, {}, PREFIXES)
    assert len(str(refused.value)) < 400  # a clear one-liner, even for a 1,200-character path
    if message != "not a BaseTrigger subclass":
        assert set(sys.modules) == before  # refused before importing anything


def test_an_allowed_prefix_does_not_allow_a_sibling_package_with_the_same_start():
    assert is_allowed("myapp.triggers.Wait", ("myapp",))
    assert not is_allowed("myapp_evil.Wait", ("myapp",))
    assert not is_allowed("myappx.triggers.Wait", ("myapp",))
    assert not is_allowed("os.system", ("myapp",))


def test_the_longest_class_path_is_the_column_length():
    assert MAX_CLASSPATH == 1000
    from celery_recovery.store.schema import triggers

    assert triggers.c.classpath.type.length == MAX_CLASSPATH


def test_kwargs_are_passed_as_keywords_only_never_evaluated(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(TriggerLoadError, match="cannot rebuild trigger"):
        load_trigger(
            "celery_recovery.triggers.temporal.DateTimeTrigger",
            {"moment": f"__import__('os').mknod('{marker}')"},
            PREFIXES,
        )
    assert not marker.exists()
