"""Batched statements compiled once per parameter shape and run as driver SQL.

The write-behind batches run the same few statements thousands of times a
second.  Through ``Connection.execute`` SQLAlchemy rebuilds each execution's
context: a cache lookup, the parameter construction and the type processing
of every row, as much client CPU as the driver's own ``executemany``.  Here
a statement is compiled once per set of parameter names; each batch applies
the columns' bind processors itself and hands plain rows to
``exec_driver_sql``, which keeps SQLAlchemy's transaction and error
translation.  Payloads that arrive already encoded (:class:`EncodedJSON`, what
every record carries) skip their column's processor, which would return them
as they are.

On PostgreSQL an ``INSERT`` batch is one statement whatever its size: the rows
travel as one JSON array that ``json_to_recordset`` unpacks on the server.
``executemany`` (even pipelined) sends, parses and acknowledges each row on
its own, which costs the client about twice as much CPU per row and the
server more as well (``benchmarks/throughput.py``).  One statement cannot
update a row twice (``ON CONFLICT`` refuses), so a batch that holds a key
twice is split where the key repeats; order is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from operator import itemgetter
from typing import Any

from sqlalchemy import BigInteger, Table, bindparam, func, literal_column, select
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import column

from celery_recovery.store.schema import EncodedJSON, UTCDateTime

_orjson_dumps: Callable[..., bytes] | None
try:  # the postgres extra brings it on CPython
    from orjson import dumps as _orjson_dumps
except ImportError:  # PyPy, or no postgres extra; tests set _orjson_dumps to None
    _orjson_dumps = None

_Processor = Callable[[Any], Any] | None


#: The parameter that carries a recordset batch's rows.
_ROWS = "recordset_rows"


def _from_recordset(stmt: Any, table: Table, keys: tuple[str, ...]) -> Any:
    """``stmt`` (an INSERT) taking its rows from one JSON array parameter."""
    rows = (
        func.json_to_recordset(bindparam(_ROWS, type_=JSON))
        .table_valued(
            *(
                column(key, BigInteger if _is_time(table, key) else table.c[key].type)
                for key in keys
            )
        )
        .render_derived(with_types=True)
    )
    values = [_from_microseconds(rows.c[k]) if _is_time(table, k) else rows.c[k] for k in keys]
    return stmt.from_select([table.c[key] for key in keys], select(*values))


def _is_time(table: Table, key: str) -> bool:
    return isinstance(table.c[key].type, UTCDateTime)


#: Times travel in a recordset as whole microseconds since the epoch: cheaper to
#: make than ISO text on the client, and to read than ISO text on the server.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _from_microseconds(value: Any) -> Any:
    # Seconds and the rest apart: each factor stays exact in the interval's float product.
    million = literal_column("1000000", BigInteger)
    return (
        literal_column("timestamptz 'epoch'")
        + (value // million) * literal_column("interval '1 second'")
        + (value % million) * literal_column("interval '1 microsecond'")
    )


def _microseconds(process: _Processor) -> Callable[[Any], Any]:
    """A time column's JSON value: the bound (aware UTC) time in epoch microseconds."""

    def to_json(value: Any) -> Any:
        # Records hold aware UTC times, which the bind processor returns as they are:
        # only another time goes through it (converted, or refused when naive).
        if process is not None and value.tzinfo is not UTC:
            value = process(value)
        return (value - _EPOCH) // _MICROSECOND

    return to_json


def _json_value(value: Any) -> Any:
    if isinstance(value, date):  # datetimes here are aware UTC (UTCDateTime)
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def recordset_json(rows: Sequence[dict[str, Any]]) -> str:
    """A recordset batch's rows as one JSON array.

    With orjson (the ``postgres`` extra, on CPython) about 0.7 µs a queued row
    instead of 3.5 with the standard library's encoder: the batch is text of
    about 700 bytes a row, much of it already-encoded payloads to escape again.
    Both write the same JSON (the rows hold strings, integers, booleans and
    None; times are epoch microseconds by then).
    """
    if _orjson_dumps is not None:
        return str(_orjson_dumps(rows, default=_json_value), "utf-8")
    return json.dumps(rows, default=_json_value, separators=(",", ":"))


class _Shape:
    """One compiled form of a statement: its SQL and how to make its parameters."""

    def __init__(
        self, stmt: Any, table: Table, keys: tuple[str, ...], dialect: Any, recordset: bool = False
    ) -> None:
        if recordset:
            stmt = _from_recordset(stmt, table, keys)
        compiled = stmt.compile(dialect=dialect, column_keys=list(keys))
        self.sql = compiled.string
        # Bound values the statement carries itself (its WHERE's literal states).
        constants = {k: v for k, v in compiled.params.items() if k not in keys and k != _ROWS}
        processors: dict[str, _Processor] = {
            key: table.c[key].type.bind_processor(dialect) for key in keys
        }
        if recordset:
            processors = {
                key: _microseconds(process) if _is_time(table, key) else process
                for key, process in processors.items()
            }
        self.constants = constants
        # A recordset row is one object of the array: its values under the column names.
        self.positional = bool(compiled.positional) and not recordset
        if recordset:
            names = keys
        else:
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
        self._named_processors = tuple((names[i], process) for i, process in self._processors)

    def objects(self, rows: Sequence[dict[str, Any]], owned: bool) -> Sequence[dict[str, Any]]:
        """A recordset's rows: each row's own keys (json_to_recordset takes the columns by
        name and ignores the rest), with the values that need it processed; in place
        when the caller ``owned`` the rows (made them for this batch)."""
        processors = self._named_processors
        out = rows if owned else [dict(row) for row in rows]
        for values in out:
            for key, process in processors:
                value = values[key]
                if value is not None and type(value) is not EncodedJSON:
                    values[key] = process(value)
        return out

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
                value = values[i]
                if value is not None and type(value) is not EncodedJSON:
                    values[i] = process(value)
            if self.positional:
                out.append(tuple(values))
            else:
                out.append(dict(zip(self.names, values, strict=True)))
        return out


class PrecompiledBatch:
    """A statement over one table's columns, run for a batch of uniform rows.

    ``key`` names the columns of the conflict target of an ``INSERT``: given, the
    batch is one statement per run of distinct keys on PostgreSQL.
    """

    def __init__(self, stmt: Any, table: Table, key: tuple[str, ...] | None = None) -> None:
        self.stmt = stmt
        self.table = table
        self.key = key
        self._shapes: dict[tuple[Any, frozenset[str], bool], _Shape] = {}

    def execute(
        self, conn: Connection, rows: Sequence[dict[str, Any]], owned: bool = False
    ) -> None:
        """Apply the statement to every row of ``rows`` (all with the same keys), in order;
        ``owned`` rows were made for this call and may be changed by it."""
        if not rows:
            return
        dialect = conn.dialect
        keys = frozenset(rows[0])
        recordset = self.key is not None and len(rows) > 1 and dialect.name == "postgresql"
        shape = self._shapes.get((dialect.name, keys, recordset))
        if shape is None:
            shape = self._shapes[(dialect.name, keys, recordset)] = _Shape(
                self.stmt, self.table, tuple(sorted(keys)), dialect, recordset
            )
        if recordset:
            assert self.key is not None
            for run in _distinct_runs(rows, itemgetter(*self.key)):
                payload = recordset_json(shape.objects(run, owned))
                conn.exec_driver_sql(shape.sql, {**shape.constants, _ROWS: payload})
            return
        params = shape.rows(rows)
        conn.exec_driver_sql(shape.sql, params if len(params) > 1 else params[0])


def _distinct_runs(
    rows: Sequence[dict[str, Any]], key: Callable[[dict[str, Any]], Any]
) -> Iterator[Sequence[dict[str, Any]]]:
    """``rows`` cut into consecutive runs in which no key repeats."""
    seen: set[Any] = set()
    start = 0
    for index, row in enumerate(rows):
        k = key(row)
        if k in seen:
            yield rows[start:index]
            seen = set()
            start = index
        seen.add(k)
    yield rows[start:]
