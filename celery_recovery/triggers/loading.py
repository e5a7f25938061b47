"""Turning a stored class path back into a trigger, only from allowed modules.

Trigger rows live in the database, so a class path read from one is input:
it is imported only when it lies under an allowed module prefix
(``recovery_trigger_allowed_modules``) and must name a :class:`BaseTrigger`
subclass.  Keyword arguments are JSON; nothing is unpickled.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from ..errors import DeferralError
from .base import BaseTrigger

#: Always allowed: the built-in triggers.
BUILTIN_PREFIX = "celery_recovery"


class TriggerLoadError(DeferralError):
    """A stored trigger cannot be rebuilt (not allowed, not importable, bad arguments)."""


def allowed_prefixes(app: Any, configured: tuple[str, ...] | None) -> tuple[str, ...]:
    """The module prefixes trigger classes may come from, for ``app``."""
    if configured is not None:
        return (BUILTIN_PREFIX, *configured)
    found = {BUILTIN_PREFIX}
    for task in list(app.tasks.values()):
        top = (type(task).__module__ or "").split(".")[0]
        if top and top not in ("celery", "__main__"):
            found.add(top)
    return tuple(sorted(found))


def is_allowed(classpath: str, prefixes: tuple[str, ...]) -> bool:
    module = classpath.rpartition(".")[0]
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def load_trigger(classpath: str, kwargs: Any, prefixes: tuple[str, ...]) -> BaseTrigger:
    """Rebuild a trigger; raises :class:`TriggerLoadError` saying why it cannot be."""
    if not isinstance(classpath, str) or "." not in classpath:
        raise TriggerLoadError(f"trigger class path {classpath!r} is not 'module.Class'")
    if not is_allowed(classpath, prefixes):
        raise TriggerLoadError(
            f"trigger class {classpath!r} is outside the allowed modules "
            f"({', '.join(prefixes)}); set recovery_trigger_allowed_modules to allow it"
        )
    module_name, _, name = classpath.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TriggerLoadError(
            f"cannot import trigger module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseTrigger)):
        raise TriggerLoadError(f"{classpath!r} is not a BaseTrigger subclass")
    if not isinstance(kwargs, dict):
        raise TriggerLoadError(f"trigger {classpath!r} kwargs {kwargs!r} are not a JSON object")
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise TriggerLoadError(
            f"cannot rebuild trigger {classpath!r} from {kwargs!r}: {type(exc).__name__}: {exc}"
        ) from exc


def serialize_trigger(trigger: Any, prefixes: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """``trigger.serialize()``, checked: an allowed class path and JSON keyword arguments."""
    if not isinstance(trigger, BaseTrigger):
        raise TriggerLoadError(f"defer() needs a BaseTrigger instance, got {trigger!r}")
    result = trigger.serialize()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TriggerLoadError(
            f"{type(trigger).__name__}.serialize() must return (class path, kwargs dict), "
            f"got {result!r}"
        )
    classpath, kwargs = result
    if not isinstance(classpath, str) or not isinstance(kwargs, dict):
        raise TriggerLoadError(
            f"{type(trigger).__name__}.serialize() must return (str, dict), got {result!r}"
        )
    check_json(kwargs, f"{type(trigger).__name__} kwargs")
    if not is_allowed(classpath, prefixes):
        raise TriggerLoadError(
            f"trigger class {classpath!r} is outside the allowed modules "
            f"({', '.join(prefixes)}); set recovery_trigger_allowed_modules to allow it"
        )
    return classpath, kwargs


def check_json(value: Any, what: str) -> None:
    """Refuse ``value`` unless it survives plain JSON unchanged in meaning."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TriggerLoadError(
            f"{what} must be JSON (str, number, bool, None, list, dict): {exc}"
        ) from None
