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

from celery_recovery.core.errors import DeferralError
from celery_recovery.triggers.base import BaseTrigger

#: Always allowed: the built-in triggers.
BUILTIN_PREFIX = "celery_recovery"
#: Longest class path accepted (the length of the ``triggers.classpath`` column).
MAX_CLASSPATH = 1000


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


def check_classpath(classpath: Any) -> None:
    """Refuse anything but ``package.module.Class`` made of plain identifiers.

    Empty parts (``a..b``), relative (``.a``) or path-like (``a/../b``) names,
    dunder parts (``__main__``) and over-long paths never reach the importer.
    """
    if not isinstance(classpath, str) or "." not in classpath:
        raise TriggerLoadError(f"trigger class path {_clip(classpath)} is not 'module.Class'")
    if len(classpath) > MAX_CLASSPATH:
        raise TriggerLoadError(
            f"trigger class path {_clip(classpath)} is {len(classpath)} characters long, "
            f"over the {MAX_CLASSPATH} allowed"
        )
    for part in classpath.split("."):
        if not part.isidentifier() or (part.startswith("__") and part.endswith("__")):
            raise TriggerLoadError(
                f"trigger class path {_clip(classpath)} is not 'module.Class': "
                f"{part!r} is not a plain Python name"
            )


def _clip(value: Any, width: int = 120) -> str:
    """``repr(value)`` cut to ``width`` characters, so a planted value cannot flood a log."""
    return _short(repr(value), width)


def _short(text: str, width: int = 300) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def load_trigger(classpath: str, kwargs: Any, prefixes: tuple[str, ...]) -> BaseTrigger:
    """Rebuild a trigger; raises :class:`TriggerLoadError` saying why it cannot be."""
    check_classpath(classpath)
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
    if not (isinstance(cls, type) and issubclass(cls, BaseTrigger)) or cls is BaseTrigger:
        raise TriggerLoadError(f"{classpath!r} is not a BaseTrigger subclass")
    if not isinstance(kwargs, dict):
        raise TriggerLoadError(
            f"trigger {classpath!r} kwargs {_clip(kwargs)} are not a JSON object"
        )
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise TriggerLoadError(
            f"cannot rebuild trigger {classpath!r} from {_clip(kwargs)}: "
            f"{type(exc).__name__}: {_short(str(exc))}"
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
    check_classpath(classpath)
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
