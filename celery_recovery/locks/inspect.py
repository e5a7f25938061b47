"""Reading which idempotency keys are held, for ``celery-recovery inspect locks``.

Walks the lock keys with ``SCAN`` (never ``KEYS``, which blocks Redis on a large
keyspace) and reads each one's value and lease in one pipelined round trip per
page.  Read-only: nothing here takes, extends or releases a lock.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import redis

from celery_recovery.locks.redis_lock import IdempotencyLocks, parse_lock_value

#: Keys asked for per SCAN call.
SCAN_PAGE = 500


def held_locks(url: str, now: datetime, limit: int = 500) -> list[dict[str, Any]]:
    """Held locks as ``key, holder, token, ttl`` (seconds left) and ``expires_at``, by key."""
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    prefix = IdempotencyLocks.lock_key("")
    pattern = prefix.replace("[", "\\[").replace("*", "\\*").replace("?", "\\?") + "*"
    found: list[dict[str, Any]] = []
    try:
        cursor = 0
        while True:
            cursor, names = client.scan(cursor, match=pattern, count=SCAN_PAGE)
            found.extend(_read(client, names, prefix, now))
            if cursor == 0 or len(found) >= limit:
                break
    finally:
        client.close()
    return sorted(found, key=lambda lock: lock["key"])[:limit]


def _read(
    client: redis.Redis, names: list[bytes | str], prefix: str, now: datetime
) -> list[dict[str, Any]]:
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
        pipe.pttl(name)
    replies = pipe.execute()
    locks = []
    for name, value, pttl in zip(names, replies[0::2], replies[1::2], strict=True):
        if value is None:  # released between SCAN and GET
            continue
        holder, token = parse_lock_value(value)
        ttl = pttl / 1000 if pttl and pttl > 0 else None
        locks.append(
            {
                "key": _text(name)[len(prefix) :],
                "holder": holder,
                "token": token,
                "ttl": ttl,
                "expires_at": now + timedelta(seconds=ttl) if ttl is not None else None,
            }
        )
    return locks


def _text(name: bytes | str) -> str:
    # A client made with decode_responses=True returns str keys.
    return name if isinstance(name, str) else name.decode(errors="replace")
