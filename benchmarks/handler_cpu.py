"""CPU of celery-recovery's own code in a benchmark's processes, measured in place.

Imported by ``bench_app`` when ``BENCH_HANDLER_CPU`` names a directory: every
signal handler on the hot path, and the claim the task classes' ``before_start``
makes, is wrapped to add up the CPU time of its own
thread (``time.thread_time_ns``: time spent waiting for a core is not
counted), and each writer thread's CPU is taken when its process ends.  Each
process then writes ``<role>-<pid>.json`` there, ``role`` being ``publisher``,
``worker_main`` or ``pool``; :func:`per_task` adds them up for a round.

Alone, a handler runs far faster than in a process that shares two cores with
five others (``hot_path.py`` measures that); this says what each piece costs
where it runs.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: (signal, module, handler, dispatch uid suffix) of the handlers measured.
HANDLERS = (
    ("before_task_publish", "celery_recovery.signals.publish", "on_before_publish", ".before"),
    ("after_task_publish", "celery_recovery.signals.publish", "on_after_publish", ".after"),
    ("task_received", "celery_recovery.signals.reservations", "on_received", ".received"),
    ("task_postrun", "celery_recovery.signals.tasks", "on_postrun", ".postrun"),
)
#: (name, module, function) of the task-class hooks' work measured: the hook calls the
#: function through its module, so replacing it there wraps it.
HOOKS = (("before_start", "celery_recovery.signals.tasks", "start_try"),)

_spent: dict[str, list[int]] = {}
_writers: dict[int, float] = {}  # native thread id -> CPU seconds when it ended (or -1)


def _timed(name: str, handler: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.thread_time_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return handler(*args, **kwargs)
        finally:
            entry = _spent.setdefault(name, [0, 0])
            entry[0] += 1
            entry[1] += clock() - start

    return timed


def _thread_cpu(native_id: int) -> float | None:
    try:
        with open(f"/proc/self/task/{native_id}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _watch_writers() -> None:
    from celery_recovery.runtime.write_behind import WriteBehindWriter

    run = WriteBehindWriter._run

    def watched(self: Any) -> None:
        native_id = threading.get_native_id()
        _writers[native_id] = -1.0
        try:
            run(self)
        finally:
            _writers[native_id] = time.thread_time()

    WriteBehindWriter._run = watched  # type: ignore[method-assign]


def _writer_cpu(native_id: int) -> float:
    """The writer thread's CPU: read while it runs, or taken as it ended (at exit it
    may be ending right now: wait a moment for the figure its last act records)."""
    deadline = time.monotonic() + 1.0
    while True:
        ended = _writers[native_id]
        if ended >= 0:
            return ended
        seconds = _thread_cpu(native_id)
        if seconds is not None:
            return seconds
        if time.monotonic() > deadline:
            return 0.0
        time.sleep(0.01)


def _dump(directory: Path, role: str) -> None:
    writers = sum(_writer_cpu(native_id) for native_id in list(_writers))
    report = {
        "role": role,
        "handlers": {name: {"calls": c, "cpu_s": ns / 1e9} for name, (c, ns) in _spent.items()},
        "writer_cpu_s": writers,
    }
    (directory / f"{role}-{os.getpid()}.json").write_text(json.dumps(report))


def install(directory: str) -> None:
    """Wrap the handlers (after ``Recovery(app)`` connected them) and dump at exit."""
    import importlib

    from celery import signals

    for signal_name, module_name, handler_name, suffix in HANDLERS:
        module = importlib.import_module(module_name)
        signal = getattr(signals, signal_name)
        uid = module.__name__ + suffix
        signal.disconnect(dispatch_uid=uid)
        signal.connect(
            _timed(signal_name, getattr(module, handler_name)), weak=False, dispatch_uid=uid
        )
    for name, module_name, function_name in HOOKS:
        module = importlib.import_module(module_name)
        setattr(module, function_name, _timed(name, getattr(module, function_name)))
    _watch_writers()
    path = Path(directory)
    role = "publisher" if "--publish" in sys.argv else "worker_main"
    atexit.register(_dump, path, role)
    # A pool process ends without running atexit handlers.
    signals.worker_process_shutdown.connect(lambda **_: _dump(path, "pool"), weak=False)


def per_task(directory: str, tasks: int) -> dict[str, float]:
    """Microseconds of CPU per task of each handler and of each side's writer threads,
    summed over the round's processes (``<role>.<signal>`` and ``<role>.writer``)."""
    totals: dict[str, float] = {}
    for path in Path(directory).glob("*.json"):
        report = json.loads(path.read_text())
        role = report["role"]
        for name, spent in report["handlers"].items():
            key = f"{role}.{name}"
            totals[key] = totals.get(key, 0.0) + spent["cpu_s"]
        if report["writer_cpu_s"]:
            key = f"{role}.writer"
            totals[key] = totals.get(key, 0.0) + report["writer_cpu_s"]
    per = {key: round(seconds / tasks * 1e6, 1) for key, seconds in sorted(totals.items())}
    per["all"] = round(sum(totals.values()) / tasks * 1e6, 1)
    return per
