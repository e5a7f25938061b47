"""Batched statements compiled once per parameter shape and run as driver SQL.

The write-behind batches run the same few statements thousands of times a
second.  Through ``Connection.execute`` SQLAlchemy rebuilds each execution's
context: a cache lookup, the parameter construction and the type processing
of every row, as much client CPU as the driver's own ``executemany``.  Here
a statement is compiled once per set of parameter names; each batch applies
the columns' bind processors itself and hands plain rows to
``exec_driver_sql``, which keeps SQLAlchemy's transaction and error
translation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import Connection

_Processor = Callable[[Any], Any] | None


class _Shape:
    """One compiled form of a statement: its SQL and how to make its parameters."""

    def __init__(self, stmt: Any, table: Table, keys: tuple[str, ...], dialect: Any) -> None:
        compiled = stmt.compile(dialect=dialect, column_keys=list(keys))
        self.sql = compiled.string
        # Bound values the statement carries itself (its WHERE's literal states).
        constants = {k: v for k, v in compiled.params.items() if k not in keys}
        processors: dict[str, _Processor] = {
            key: table.c[key].type.bind_processor(dialect) for key in keys
        }
        self.positional = bool(compiled.positional)
        names = tuple(compiled.positiontup or ()) if self.positional else tuple(compiled.params)
        self.names = names
        # Per row: one C-level lookup of its values in order, then the few processors
        # (datetimes, JSON) where a value is set; constants (the statement's own literal
        # states) come from a template.
        slots = [i for i, name in enumerate(names) if name not in constants]
        self._slots = tuple(slots)
        self._getter = itemgetter(*(names[i] for i in slots)) if slots else None
        self._template = tuple(constants.get(name) for name in names)
        self._processors = tuple(
            (i, process) for i in slots if (process := processors.get(names[i])) is not None
        )

    def rows(self, rows: Sequence[dict[str, Any]]) -> list[Any]:
        out: list[Any] = []
        getter, slots, processors = self._getter, self._slots, self._processors
        only_values = len(slots) == len(self._template)
        for row in rows:
            if getter is None:
                values = list(self._template)
            else:
                found = getter(row)
                if len(slots) == 1:
                    found = (found,)
                if only_values:
                    values = list(found)
                else:
                    values = list(self._template)
                    for i, value in zip(slots, found, strict=True):
                        values[i] = value
            for i, process in processors:
                if values[i] is not None:
                    values[i] = process(values[i])
            if self.positional:
                out.append(tuple(values))
            else:
                out.append(dict(zip(self.names, values, strict=True)))
        return out


class PrecompiledBatch:
    """A statement over one table's columns, run for a batch of uniform rows."""

    def __init__(self, stmt: Any, table: Table) -> None:
        self.stmt = stmt
        self.table = table
        self._shapes: dict[tuple[Any, frozenset[str]], _Shape] = {}

    def execute(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Run the statement once per row of ``rows`` (all with the same keys)."""
        if not rows:
            return
        dialect = conn.dialect
        keys = frozenset(rows[0])
        shape = self._shapes.get((dialect.name, keys))
        if shape is None:
            shape = self._shapes[(dialect.name, keys)] = _Shape(
                self.stmt, self.table, tuple(sorted(keys)), dialect
            )
        params = shape.rows(rows)
        conn.exec_driver_sql(shape.sql, params if len(params) > 1 else params[0])
