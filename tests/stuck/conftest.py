"""Fixtures of the stuck-worker tests (a broker behind a freezable proxy)."""

from tests.stuck.helpers import broker_proxy, start_proxied_worker

__all__ = ["broker_proxy", "start_proxied_worker"]
