"""Read metrics the way Prometheus does: over HTTP, parsed by prometheus-client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples | None:
    """Every sample on http://127.0.0.1:port/metrics; None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def local(name: str, **labels: str) -> float:
    """This test process's value of a sample (0 when absent)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0
