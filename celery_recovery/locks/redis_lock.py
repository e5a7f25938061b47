"""Idempotency locks in Redis, with fencing tokens, leases and remembered results.

One key per idempotency key holds ``"<holder>|<token>"`` with a lease (PX).
The token comes from one store-wide counter (INCR), so it grows with every
acquisition of any key, hence of each key.  Acquire, renew and release are
Lua scripts: one round trip each, and renew/release act only for the holder
of the current token, so a paused process that wakes up after its lease
expired cannot extend or release a lock a newer attempt holds.  A completed
key remembers its JSON result for ``result_ttl``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

PREFIX = "celery-recovery"
TOKEN_COUNTER = f"{PREFIX}:fencing-token"

_ACQUIRE = """
local done = redis.call('GET', KEYS[2])
if done then return {2, done} end
local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
local token = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return {1, tostring(token)}
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) end
redis.call('DEL', KEYS[1])
return 1
"""

ACQUIRED, HELD, DONE = "acquired", "held", "done"


@dataclass(frozen=True)
class Acquisition:
    """The outcome of one acquire: ``acquired`` (with ``token``), ``held`` (by ``holder``)
    or ``done`` (with the stored ``result`` JSON)."""

    outcome: str
    token: int | None = None
    holder: str | None = None
    result: str | None = None

    @property
    def value(self) -> str:
        return f"{self.holder}|{self.token}"


class IdempotencyLocks:
    """Lock, renew and release idempotency keys in one Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str) -> IdempotencyLocks:
        return cls(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2))

    @staticmethod
    def lock_key(key: str) -> str:
        return f"{PREFIX}:lock:{key}"

    @staticmethod
    def result_key(key: str) -> str:
        return f"{PREFIX}:result:{key}"

    def acquire(self, key: str, holder: str, ttl: float) -> Acquisition:
        kind, data = self._acquire(
            keys=[self.lock_key(key), self.result_key(key), TOKEN_COUNTER],
            args=[holder, int(ttl * 1000)],
        )
        data = data.decode() if isinstance(data, bytes) else data
        if kind == 1:
            return Acquisition(ACQUIRED, token=int(data), holder=holder)
        if kind == 2:
            return Acquisition(DONE, result=data)
        owner, token = parse_lock_value(data)
        return Acquisition(HELD, token=token, holder=owner)

    def renew(self, key: str, value: str, ttl: float) -> bool:
        return bool(self._renew(keys=[self.lock_key(key)], args=[value, int(ttl * 1000)]))

    def renew_many(self, leases: Sequence[tuple[str, str, float]]) -> list[bool]:
        """Renew several leases in one round trip; True for each still held."""
        pipe = self.client.pipeline(transaction=False)
        for key, value, ttl in leases:
            self._renew(keys=[self.lock_key(key)], args=[value, int(ttl * 1000)], client=pipe)
        return [bool(r) for r in pipe.execute()]

    def release(self, key: str, value: str, result_json: str | None, result_ttl: float) -> bool:
        """Release, storing ``result_json`` as the key's result; False if no longer held."""
        return bool(
            self._release(
                keys=[self.lock_key(key), self.result_key(key)],
                args=[value, result_json or "", int(result_ttl * 1000)],
            )
        )

    def holder_of(self, key: str) -> tuple[str | None, int | None, float | None]:
        """(holder, token, seconds left) of a key's lock, for inspection."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.lock_key(key))
        pipe.pttl(self.lock_key(key))
        value, ttl = pipe.execute()
        if value is None:
            return None, None, None
        owner, token = parse_lock_value(value)
        return owner, token, ttl / 1000 if ttl and ttl > 0 else None


def parse_lock_value(value: bytes | str) -> tuple[str, int | None]:
    """(holder, fencing token) of a lock's value, ``"<holder>|<token>"``."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    holder, _, token = text.rpartition("|")
    return holder, int(token) if token.isdigit() else None
