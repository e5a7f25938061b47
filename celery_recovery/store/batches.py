"""How buffered writes become few statements: folded, grouped by kind and by shape.

The write-behind writer hands :meth:`~celery_recovery.store.tries.TryRepository.apply_writes`
a batch of writes in the order they were made.  Here they are folded (a try's
outcome into its claim), cut into runs of one kind, and the rows of a run given
one shape, so that each run is one statement or one ``executemany``; order is
kept across runs.  Nothing here touches the database.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

from celery_recovery.core.records import Transition, WriteKind
from celery_recovery.core.states import TaskState

#: Values for columns a record leaves out, where NULL is not the right default.
_RECORD_DEFAULTS = {"republishable": True, "publish_count": 1}

#: Kinds whose run is written as one statement when no try repeats in it
#: (:class:`~celery_recovery.store.precompiled.PrecompiledBatch`).
_UPSERTED = (WriteKind.QUEUED, WriteKind.RUNNING)

#: What makes transitions one statement: their expected states, the columns they
#: set, and whether they name no try (any try of the task in an expected state).
TransitionShape = tuple[tuple[TaskState, ...], tuple[str, ...], bool]


def coalesce(writes: Sequence[tuple[WriteKind, Any]]) -> list[tuple[WriteKind, Any]]:
    """Fold a try's outcome into its claim when both wait in the same batch.

    A short task's claim and outcome usually share a flush: writing the row
    once, already finished, halves the statements on the hot path.  The
    claim's conditions still apply (it only lands on a claimable try).  A
    reservation followed by the same process's claim of the try (a solo or
    threads pool) is superseded by the claim and not written at all.
    """
    # Where each claim is in ``out``: a claim is copied only when an outcome folds into it.
    claims: dict[tuple[str, int], int] = {}
    out: list[tuple[WriteKind, Any]] = []
    started: set[tuple[str, int]] = set()
    if any(kind == WriteKind.RESERVED for kind, _item in writes):
        started = {(i["task_id"], i["try_number"]) for k, i in writes if k == WriteKind.RUNNING}
    for kind, item in writes:
        if kind == WriteKind.RESERVED and (item[0], item[1]) in started:
            continue
        if kind == WriteKind.RUNNING:
            claims[(item["task_id"], item["try_number"])] = len(out)
            out.append((kind, item))
            continue
        if kind == WriteKind.TRANSITION and item.expected == (TaskState.RUNNING,):
            index = claims.pop((item.task_id, item.try_number), None)
            if index is not None:
                out[index] = (WriteKind.RUNNING, {**out[index][1], **item.values})
                continue
        out.append((kind, item))
    return out


def runs(writes: Sequence[tuple[WriteKind, Any]]) -> Iterator[tuple[WriteKind, list[Any]]]:
    """Consecutive writes of one kind, batched; order is kept across kinds."""
    for kind, run in groupby(writes, key=itemgetter(0)):
        yield kind, [item for _kind, item in run]


def one_statement(batch: Sequence[tuple[WriteKind, list[Any]]]) -> bool:
    """Whether the runs of ``batch`` are written by a single statement."""
    if len(batch) != 1:
        return False
    kind, items = batch[0]
    if kind == WriteKind.RESERVED:
        return True  # one row per try, always one statement
    if kind not in _UPSERTED:
        return False
    return len(items) == 1 or len({(r["task_id"], r["try_number"]) for r in items}) == len(items)


def uniform(
    records: Sequence[dict[str, Any]], extra: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """New rows for a batch's records, all with the same keys (executemany wants one
    shape), with ``extra``'s values added.

    Only the union of the batch's own keys is sent: type processing of
    columns nobody set is the largest client-side cost of a batch.
    """
    extra = extra or {}
    first = records[0].keys() if records else set()
    if "external_executor_id" in first and all(r.keys() == first for r in records):
        # The usual batch: records of one kind, made by one function.
        rows = [{**record, **extra} for record in records]
    else:
        keys = set().union(*records) | {"external_executor_id"}
        rows = [
            {**{key: record.get(key, _RECORD_DEFAULTS.get(key)) for key in keys}, **extra}
            for record in records
        ]
    for row in rows:
        if row["external_executor_id"] is None:
            row["external_executor_id"] = row["task_id"]
    return rows


def transition_groups(
    changes: Sequence[Transition],
) -> Iterator[tuple[TransitionShape, list[Transition]]]:
    """Consecutive changes of one shape, batched; order is kept across shapes."""
    for shape, group in groupby(changes, key=_transition_shape):
        yield shape, list(group)


def _transition_shape(change: Transition) -> TransitionShape:
    return change.expected, tuple(sorted(change.values)), change.try_number is None
