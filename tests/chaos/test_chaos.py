"""The chaos run at CI size: workers, beat and triggerer SIGKILLed under load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos.run import ChaosConfig, ChaosTarget, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.timeout(420)
def test_chaos_run_loses_nothing_and_repeats_no_side_effect(
    pg_url: str, broker_urls: tuple[str, str], queue: str, tmp_path: Path
) -> None:
    # Given 3 workers, beat with the aggressive sweep and a triggerer, on PostgreSQL;
    # When 120 tasks run while a worker is SIGKILLed every 3-6 s for 35 s (beat and the
    # triggerer once each);
    summary = run_chaos(
        ChaosConfig(tasks=120, seconds=35.0, quiesce_timeout=180.0),
        ChaosTarget(pg_url, *broker_urls, queue, tmp_path),
    )
    print(json.dumps(summary, indent=2, default=str))

    # Then every task finished once, with its side effects and callbacks exactly once.
    assert summary["violations"] == [], json.dumps(summary, indent=2, default=str)
    assert summary["lost"] == 0 and summary["duplicates"] == 0
    assert summary["kills"]["workers"] >= 5
    assert summary["kills"]["beat"] == 1 and summary["kills"]["triggerer"] == 1
    assert summary["recoveries"] > 0
