"""What every repository shares: the store's database, its transactions and statements."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy.engine import Connection

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
