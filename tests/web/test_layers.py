"""The console reads the store and nothing else: no sweep, signal or installation code."""

from __future__ import annotations

import ast
from pathlib import Path

import celery_recovery.web

FORBIDDEN = ("sweeps", "signals", "recovery", "redundant_deliveries", "triggerer", "runtime")


def test_the_web_package_imports_no_mechanism():
    found = []
    for path in Path(celery_recovery.web.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                top = (node.module or "").split(".")[0]
                if node.level == 2 and top in FORBIDDEN:
                    found.append(f"{path.name}: from ..{node.module}")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                )
                for name in names:
                    parts = (name or "").split(".")
                    if parts[0] == "celery_recovery" and len(parts) > 1 and parts[1] in FORBIDDEN:
                        found.append(f"{path.name}: {name}")
    assert found == []
