"""The cached process id: a forked child must never see its parent's.

Every handler asks ``RecoveryContext.runtime`` whether this process built its
runtime; a stale id in a prefork pool process would make it use the parent's
writer thread and store connections.
"""

from __future__ import annotations

import os

from celery_recovery.core.process_id import current_pid


def test_the_cached_id_is_this_processs():
    assert current_pid() == os.getpid()


def test_a_forked_child_sees_its_own_id():
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.close(read)
        os.write(write, f"{current_pid()} {os.getpid()}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        cached, real = pipe.read().split()
    os.waitpid(child, 0)
    assert int(cached) == int(real) == child
    assert current_pid() == os.getpid() != child
