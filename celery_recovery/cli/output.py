"""How the operator commands print rows: aligned tables for people, JSON for scripts.

Tables are padded on the plain text and only then coloured, so columns line
up whether or not colour is shown; ``click.echo`` drops the colour codes when
stdout is not a terminal (a pipe, a file, a probe), so scripts that grep the
table see plain text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import click

#: Largest --limit / --batch-size accepted: far above any useful page, and within
#: the 64-bit integers both databases bind.
MAX_ROWS = 10_000_000
#: ``--limit`` and ``--batch-size`` values: whole numbers from 1 to :data:`MAX_ROWS`.
ROW_COUNT = click.IntRange(min=1, max=MAX_ROWS)

#: Colour of a cell by its plain text, where the text carries a verdict.
VERDICT_COLOURS = {
    "yes": "green",
    "no": "red",
    "running": "green",
    "success": "green",
    "queued": "cyan",
    "deferred": "cyan",
    "up_for_retry": "yellow",
    "failed": "red",
    "revoked": "yellow",
}


@dataclass(frozen=True)
class Column:
    """One table column: its header, the row key it shows, and how to format the value."""

    header: str
    key: str
    fmt: Callable[[Any], str] | None = None
    coloured: bool = False

    def text(self, row: dict[str, Any]) -> str:
        value = row.get(self.key)
        if self.fmt is not None:
            return self.fmt(value)
        if value is None:
            return "-"
        if isinstance(value, datetime):
            return value.strftime("%Y-%m-%d %H:%M:%SZ")
        return str(value)


def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def yes_no(value: Any) -> str:
    return "yes" if value else "no"


def age_seconds(now: datetime, then: datetime | None) -> float | None:
    """Seconds from ``then`` to ``now``, never negative (clocks of hosts differ a little)."""
    if then is None:
        return None
    return round(max((now - then).total_seconds(), 0.0), 3)


def table_lines(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> list[str]:
    """The header and one line per row, columns aligned; verdict cells styled."""
    cells = [[column.text(row) for column in columns] for row in rows]
    widths = [
        max([len(column.header), *(len(line[i]) for line in cells)])
        for i, column in enumerate(columns)
    ]
    header = "  ".join(c.header.ljust(w) for c, w in zip(columns, widths, strict=True))
    lines = [click.style(header.rstrip(), bold=True)]
    for line in cells:
        parts = []
        for column, width, text in zip(columns, widths, line, strict=True):
            padded = text.ljust(width)
            colour = VERDICT_COLOURS.get(text) if column.coloured else None
            parts.append(click.style(padded, fg=colour) if colour else padded)
        lines.append("  ".join(parts).rstrip())
    return lines


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def emit(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    as_json: bool,
    empty: str,
) -> None:
    """Print ``rows`` as a JSON list (every key) or as a table (the ``columns``)."""
    if as_json:
        click.echo(json.dumps(list(rows), default=_json_default))
        return
    if not rows:
        click.echo(empty)
        return
    for line in table_lines(rows, columns):
        click.echo(line)
