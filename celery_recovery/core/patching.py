"""Every method of Celery's, or of a task class, that celery-recovery wraps.

They are all wrapped through :func:`wrap_once`, so that ``grep wrap_once`` lists what
to check at each Celery upgrade: ``Request.on_failure``, ``Request.reject`` and
``Request.on_timeout`` (the worker's main process), ``Control.revoke``,
``revoke_by_stamped_headers`` and ``purge``, ``celery purge``'s callback, and on task
classes ``before_start``, ``__call__`` (resumed deliveries) and ``celery.chord_unlock``'s
``run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Set on every wrapper of ours: a second install finds it and wraps nothing.
MARK = "_celery_recovery_wrapped"


def wrap_once(
    owner: Any, name: str, wrap: Callable[[Any], Any], *, per_class: bool = False
) -> bool:
    """Replace ``owner.name`` by ``wrap(original)`` unless it is already ours; True when
    replaced.  ``per_class``: only ``owner``'s own attribute counts as ours, so that a
    subclass of a wrapped class is wrapped too (each task class gets its own hook)."""
    found = owner.__dict__.get(name) if per_class else getattr(owner, name, None)
    if is_ours(found):
        return False
    wrapper = wrap(getattr(owner, name, None))
    setattr(wrapper, MARK, True)
    setattr(owner, name, wrapper)
    return True


def is_ours(attribute: Any) -> bool:
    """Whether ``attribute`` is a wrapper of ours."""
    return bool(getattr(attribute, MARK, False))


def wrapped_here(cls: type, name: str) -> bool:
    """Whether ``cls`` itself (not a base) holds our wrapper of ``name``."""
    return is_ours(cls.__dict__.get(name))
