"""The links of a list page, as the admin's changelist has them: filters in the sidebar,
the active filters one can drop, the next page.

Lists page by the console's keyset cursor (``before``), not by page number: a
page deep in a million tries costs what the first costs.  Any change of filter
starts again at the newest rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

#: The cursor parameter of the console's lists.
CURSOR = "before"


@dataclass(frozen=True)
class Choice:
    label: str
    href: str
    selected: bool


@dataclass(frozen=True)
class Filter:
    """One filter of the sidebar: a title and its choices, "All" first."""

    title: str
    choices: list[Choice]


@dataclass(frozen=True)
class Active:
    """A filter set by a link from another page (a job, a task id): shown with a way out."""

    label: str
    value: str
    remove_href: str


def params_of(query: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The page's own parameters from a query string (others are dropped, never echoed)."""
    return {name: query[name].strip() for name in (*names, CURSOR) if query.get(name, "").strip()}


def href(params: Mapping[str, str], **changes: str | None) -> str:
    """``?query`` for ``params`` with ``changes`` (None removes one), back on the first
    page unless ``changes`` names the cursor."""
    merged = {k: v for k, v in params.items() if k != CURSOR}
    for name, value in changes.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return f"?{urlencode(merged)}" if merged else "?"


def choices(params: Mapping[str, str], name: str, title: str, values: Iterable[str]) -> Filter:
    current = params.get(name)
    options = [Choice("All", href(params, **{name: None}), not current)]
    options += [Choice(v, href(params, **{name: v}), current == v) for v in values]
    return Filter(title, options)


def active(params: Mapping[str, str], labels: Mapping[str, str]) -> list[Active]:
    """The free-valued filters set in ``params`` (``name -> label``)."""
    return [
        Active(label, params[name], href(params, **{name: None}))
        for name, label in labels.items()
        if params.get(name)
    ]


@dataclass(frozen=True)
class Pager:
    """Links to the next (older) page and back to the newest; whether a filter is set."""

    older: str | None
    newest: str | None
    filtered: bool


def pager(params: Mapping[str, str], next_before: str | None) -> Pager:
    return Pager(
        older=href(params, **{CURSOR: next_before}) if next_before else None,
        newest=href(params) if params.get(CURSOR) else None,
        filtered=any(name not in (CURSOR, "limit") for name in params),
    )
