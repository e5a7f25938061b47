"""The marker watch's judgement of vanished locks, look by look (pure: no store, no clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celery_recovery.liveness.absences import LockAbsences, Vanished

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def looks(absences: LockAbsences, *seen: tuple[float, object, set[int]]) -> list[list[int]]:
    """Feed (monotonic time, server, held keys) looks; the keys confirmed gone by each."""
    return [
        [v.key for v in absences.look(server, held, at, T0 + timedelta(seconds=at))]
        for at, server, held in seen
    ]


def test_a_lock_seen_held_and_missing_for_the_confirmation_is_gone_once():
    absences = LockAbsences(confirm=1.0)
    gone = looks(
        absences,
        (0.0, "s1", {1, 2}),
        (0.5, "s1", {2}),  # 1 missing: noted
        (1.0, "s1", {2}),  # 0.5 s: not yet
        (1.5, "s1", {2}),  # 1.0 s: gone
        (2.0, "s1", {2}),  # judged once
    )
    assert gone == [[], [], [], [1], []]


def test_the_time_given_is_when_it_was_first_seen_missing():
    absences = LockAbsences(confirm=1.0)
    absences.look("s1", {7}, 0.0, T0)
    absences.look("s1", set(), 0.5, T0 + timedelta(seconds=0.5))
    assert absences.look("s1", set(), 1.5, T0 + timedelta(seconds=1.5)) == [
        Vanished(7, T0 + timedelta(seconds=0.5))
    ]


def test_a_lock_taken_again_within_the_confirmation_is_not_gone():
    absences = LockAbsences(confirm=1.0)
    gone = looks(
        absences,
        (0.0, "s1", {1}),
        (0.5, "s1", set()),  # cut
        (1.0, "s1", {1}),  # taken again on a new connection
        (1.5, "s1", set()),  # cut again: a new absence, counted from here
        (2.0, "s1", set()),
        (2.5, "s1", set()),
    )
    assert gone == [[], [], [], [], [], [1]]


def test_one_look_alone_never_confirms_however_late_it_comes():
    absences = LockAbsences(confirm=1.0)
    assert looks(absences, (0.0, "s1", {1}), (30.0, "s1", set())) == [[], []]


def test_a_lock_never_seen_held_is_never_judged():
    absences = LockAbsences(confirm=1.0)
    assert looks(absences, (0.0, "s1", set()), (1.0, "s1", set()), (5.0, "s1", set())) == [
        [],
        [],
        [],
    ]


def test_a_new_server_forgets_every_lock_seen_on_the_old_one():
    absences = LockAbsences(confirm=1.0)
    gone = looks(
        absences,
        (0.0, "s1", {1, 2}),
        (0.5, "s1", {2}),  # 1 missing
        (1.0, "s2", set()),  # restarted (or failed over): nothing held yet
        (2.5, "s2", set()),  # neither was seen held on this server
        (3.0, "s2", {2}),  # 2's holder reconnected; 1's never does
        (3.5, "s2", set()),
        (4.5, "s2", set()),  # 2 seen held here, then gone: judged
    )
    assert gone == [[], [], [], [], [], [], [2]]


def test_a_failed_look_forgets_what_was_seen():
    absences = LockAbsences(confirm=1.0)
    looks(absences, (0.0, "s1", {1}), (0.5, "s1", set()))
    absences.forget()  # the store did not answer
    assert looks(absences, (1.5, "s1", set()), (3.0, "s1", set())) == [[], []]
