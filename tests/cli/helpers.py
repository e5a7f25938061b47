"""A way to run the ``celery-recovery`` command in the test process (the rows the
tests give it are tests/builders.py's)."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from celery_recovery.cli import recovery


def run(url: str, *args: str, input: str | None = None, color: bool = False) -> Result:
    """``celery-recovery --database-url URL ARGS`` through click's runner."""
    return CliRunner().invoke(
        recovery, ["--database-url", url, *args], input=input, color=color, catch_exceptions=False
    )


def run_json(url: str, *args: str) -> list[dict[str, Any]]:
    result = run(url, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)
