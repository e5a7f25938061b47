"""What every repository shares: the store's database, its transactions and statements."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy.engine import Connection, Result, RowMapping

from celery_recovery.store.database import Database


class Repository:
    """One table's (or one concern's) store methods; each method is one short transaction."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def dialect(self) -> str:
        return self.db.dialect

    def transaction(self) -> AbstractContextManager[Connection]:
        return self.db.transaction()

    def single_statement(self) -> AbstractContextManager[Connection]:
        return self.db.single_statement()

    def _statement(self, key: Any, build: Callable[[], Any]) -> Any:
        return self.db.statement(key, build)

    def _insert(self, table: Any) -> Any:
        return self.db.insert(table)


def rows_of(result: Result[Any]) -> list[Any]:
    """The rows of ``result`` as plain dicts; callers name their record type (a TypedDict)."""
    return [dict(row) for row in result.mappings()]


def row_of(row: RowMapping | None) -> Any:
    """One row as a plain dict, or None."""
    return dict(row) if row is not None else None


def equal_where_given(values: dict[Any, Any]) -> list[Any]:
    """``column == value`` for each column whose value is given (not None): a listing's
    optional filters."""
    return [column == value for column, value in values.items() if value is not None]
