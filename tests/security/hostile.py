"""Payloads a hostile actor with write access to the store might plant."""

from __future__ import annotations

import base64
import os
import pickle
from pathlib import Path


class Planted:
    """Unpickling this creates ``path``: proof that something unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (os.mknod, (self.path,))


def pickle_text(marker: Path) -> str:
    """A protocol-0 pickle (plain ASCII, so it fits a text column) that plants ``marker``."""
    return pickle.dumps(Planted(marker), protocol=0).decode("ascii")


def pickle_base64(marker: Path) -> str:
    """The same pickle as kombu would carry it in a ``bytes`` JSON value."""
    return base64.b64encode(pickle.dumps(Planted(marker))).decode("ascii")
