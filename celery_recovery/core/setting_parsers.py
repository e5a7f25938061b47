"""How the value of one ``recovery_*`` setting is parsed and checked.

Each parser takes the key as the user wrote it (``recovery_x``, ``CELERY_RECOVERY_X``
or a keyword) and the value, which is a string when it comes from the environment,
and returns the value or raises a :class:`ConfigurationError` naming that key.  Its
docstring reads ``"<type>: <allowed values>"``: the configuration reference takes
those two columns from it (:mod:`celery_recovery.reference`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_recovery.core.durations import positive_seconds
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.presets import PRESETS
from celery_recovery.core.urls import mask_secrets, mask_url, normalise_database_url

#: The values of recovery_on_stalled_consumer.
ON_STALLED_CONSUMER_ACTIONS = ("report", "exit")
#: The values of recovery_unknown_outcome (and of the task attribute of that name).
UNKNOWN_OUTCOME_ACTIONS = ("rerun", "fail")
#: The values of recovery_database_pooler.
DATABASE_POOLER_MODES = ("auto", "none", "transaction")
#: The values of recovery_liveness_markers.
LIVENESS_MARKER_MODES = ("auto", "process", "off")
#: The values of recovery_beat_entries.
BEAT_ENTRY_SOURCES = ("beat_schedule", "django")
#: Shortest ``recovery_web_token`` accepted: long enough that guessing it is hopeless.
MIN_WEB_TOKEN_LENGTH = 16


def is_unset(value: Any, *, none_word: bool = False) -> bool:
    """Whether ``value`` leaves an optional setting at its default: ``None`` or ``""``;
    with ``none_word`` also blank text or ``none`` in any case, for settings whose
    default is ``None`` and that the environment must be able to spell."""
    if value is None or value == "":
        return True
    return none_word and isinstance(value, str) and value.strip().lower() in ("", "none")


def duration(key: str, value: Any) -> float:
    """Seconds: a positive, finite number (a numeric string in the environment) or a
    ``timedelta``."""
    return positive_seconds(key, value, timedelta_ok=True, text_ok=True)


def optional_duration(key: str, value: Any) -> float | None:
    """Seconds: a positive, finite number (a numeric string in the environment) or a
    ``timedelta``; unset or ``None`` means not declared."""
    if is_unset(value, none_word=True):
        return None
    return duration(key, value)


def count(key: str, value: Any) -> int:
    """Whole number: an integer >= 0 (a string of digits in the environment)."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{key}={value!r} must be a whole number >= 0")
    try:
        result = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{key}={value!r} must be a whole number >= 0") from None
    if result < 0 or (isinstance(value, float) and value != result):
        raise ConfigurationError(f"{key}={value!r} must be a whole number >= 0")
    return result


def positive_count(key: str, value: Any) -> int:
    """Whole number: an integer >= 1 (a string of digits in the environment)."""
    result = count(key, value)
    if result < 1:
        raise ConfigurationError(f"{key}={value!r} must be a whole number >= 1")
    return result


def factor(key: str, value: Any) -> float:
    """Factor: a finite number of at least 1 (a numeric string in the environment)."""
    problem = f"{key}={value!r} must be a number of at least 1, e.g. 3"
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigurationError(problem) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(problem)
    try:
        result = float(value)  # an int too large for a float overflows
    except OverflowError:
        raise ConfigurationError(problem) from None
    if not (result >= 1 and result != float("inf")):
        raise ConfigurationError(problem)
    return result


def _items(
    key: str,
    value: Any,
    *,
    kind: str,
    one: str,
    example: str = "",
    accept: Callable[[str], bool] = bool,
) -> tuple[str, ...]:
    """``value``, a list or one comma-separated string (as the environment gives it), as
    its items with the spaces around them removed, or an error saying it must be a list
    of ``kind`` or that an item is not ``one``."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset):
        raise ConfigurationError(
            f"{key}={value!r} must be a list of {kind} (or one comma-separated string){example}"
        )
    found = []
    for item in items:
        text = item.strip() if isinstance(item, str) else None
        if not text or not accept(text):
            raise ConfigurationError(f"{key} item {item!r} is not {one}")
        found.append(text)
    return tuple(found)


def module_prefixes(key: str, value: Any) -> tuple[str, ...] | None:
    """Module names: a list of dotted module names, or one comma-separated string;
    unset means the default."""
    if is_unset(value):
        return None
    return _items(
        key,
        value,
        kind="module names",
        one="a module name like 'myapp.triggers'",
        accept=lambda name: all(part.isidentifier() for part in name.split(".")),
    )


def patterns(key: str, value: Any) -> tuple[str, ...]:
    """Glob patterns (``fnmatch``: ``*``, ``?``, ``[...]``): a list, or one
    comma-separated string; unset means none."""
    if is_unset(value):
        return ()
    return _items(
        key,
        value,
        kind="glob patterns",
        one="a glob pattern: a non-empty string like 'metrics.*'",
        example=", e.g. ['metrics.*', 'cache.refresh']",
    )


def port(key: str, value: Any) -> int | None:
    """TCP port: an integer from 1 to 65535; unset or ``None`` serves nothing."""
    if is_unset(value, none_word=True):
        return None
    problem = f"{key}={value!r} must be a TCP port number from 1 to 65535, or None to serve nothing"
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ConfigurationError(problem)
    try:
        number = int(value.strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(problem) from None
    if not 1 <= number <= 65535:
        raise ConfigurationError(problem)
    return number


#: How the environment spells the two values of a flag.
_FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True}
_FLAG_WORDS.update({"0": False, "false": False, "no": False, "off": False})


def flag(key: str, value: Any) -> bool:
    """Flag: ``True`` or ``False`` (``1``/``0``, ``true``/``false``, ``yes``/``no``,
    ``on``/``off`` in the environment)."""
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if word not in _FLAG_WORDS:
        raise ConfigurationError(
            f"{key}={value!r} must be True or False (in the environment: 1/0, true/false, "
            "yes/no, on/off)"
        )
    return _FLAG_WORDS[word]


def preset(key: str, value: Any) -> str:
    """Preset name: one of the presets in :data:`celery_recovery.beat_schedules.PRESETS`."""
    if not isinstance(value, str) or value not in PRESETS:
        allowed = ", ".join(repr(p) for p in PRESETS)
        raise ConfigurationError(f"{key}={value!r} is not a preset; allowed: {allowed}")
    return str(value)


def _one_of(key: str, value: Any, choices: tuple[str, ...], what: str) -> str:
    """``value`` as one of ``choices`` (any case, spaces around ignored), or an error."""
    choice = value.strip().lower() if isinstance(value, str) else value
    if choice not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ConfigurationError(f"{key}={value!r} is not {what}; allowed: {allowed}")
    return str(choice)


def liveness_markers(key: str, value: Any) -> str:
    """Marker mode: ``auto``, ``process`` or ``off``."""
    return _one_of(key, value, LIVENESS_MARKER_MODES, "a marker mode")


def on_stalled(key: str, value: Any) -> str:
    """Action: ``report`` or ``exit``."""
    return _one_of(key, value, ON_STALLED_CONSUMER_ACTIONS, "an action")


def database_pooler(key: str, value: Any) -> str:
    """Pooler mode: ``auto``, ``none`` or ``transaction``."""
    return _one_of(key, value, DATABASE_POOLER_MODES, "a pooler mode")


def beat_entries(key: str, value: Any) -> str:
    """Source: ``beat_schedule`` or ``django``."""
    return _one_of(key, value, BEAT_ENTRY_SOURCES, "a source of beat entries")


def unknown_outcome(key: str, value: Any) -> str:
    """Action: ``rerun`` or ``fail``."""
    return _one_of(key, value, UNKNOWN_OUTCOME_ACTIONS, "an action")


def database_url(key: str, value: Any) -> str:
    """Database URL: ``sqlite:///<file>`` (a file, not ``:memory:``) or
    ``postgresql+psycopg://user:password@host/dbname`` (``postgresql://`` and
    ``postgres://`` are pinned to psycopg 3)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"{key}={value!r} must be a database URL string, e.g. "
            "'postgresql+psycopg://user@host/dbname' or 'sqlite:///celery_recovery.sqlite3'"
        )
    return normalise_database_url(value.strip(), key).render_as_string(hide_password=False)


def redis_url(key: str, value: Any) -> str | None:
    """Redis URL: ``redis://``, ``rediss://`` or ``unix://``; unset or empty means the
    broker URL when the broker is Redis, else none."""
    if is_unset(value):
        return None
    if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigurationError(
            f"{key}={mask_url(str(value))!r} must be a Redis URL "
            "(redis://, rediss:// or unix://), or unset to use the broker URL when it is Redis"
        )
    from redis.connection import parse_url

    try:
        parse_url(value)
    except ValueError as exc:
        # A bad port or db number would otherwise surface as a traceback at first use.
        raise ConfigurationError(
            f"{key}={mask_url(value)!r} is not a valid Redis URL: {mask_secrets(str(exc))}"
        ) from None
    return value


def web_token(key: str, value: Any) -> str | None:
    """Secret: a string of at least 16 characters; unset or empty means none."""
    if is_unset(value):
        return None
    if not isinstance(value, str) or len(value.strip()) < MIN_WEB_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{key} must be a string of at least {MIN_WEB_TOKEN_LENGTH} characters "
            "(e.g. from `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
        )
    return value.strip()


def web_credentials(key: str, value: Any) -> str | None:
    """Secret: ``user:password``, both parts non-empty; unset or empty means none."""
    if is_unset(value):
        return None
    user, colon, password = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not (user and colon and password):
        raise ConfigurationError(f"{key} must be 'user:password' with both parts non-empty")
    return value
