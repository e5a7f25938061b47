"""The celery-recovery pages of Django's admin: tries (and a task's history), recoveries,
jobs and schedules, each from the console's query for it (web/queries.py,
web/schedules.py), with the console's links between them.

Arguments, trigger kwargs and heartbeat details stay hidden, as the console
hides them unless started with ``--show-args``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from celery_recovery.contrib.django.links import active, choices, pager, params_of
from celery_recovery.contrib.django.models import Job, Recovery, Schedule, Try
from celery_recovery.contrib.django.pageadmin import StorePageAdmin, limit_of
from celery_recovery.core.audit import AuditAction, AuditReason
from celery_recovery.core.states import JobState, JobType, TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.web.queries import ConsoleQueries, Page
from celery_recovery.web.schedules import schedules


@admin.register(Try)
class TryAdmin(StorePageAdmin):
    """Tries newest first, by task id or name, state or process; a task's every try."""

    def more_urls(self) -> list[URLPattern]:
        history = self.page_view(self.history)
        return [path("<path:task_id>/", history, name="celery_recovery_try_task")]

    def page(self, request: HttpRequest, queries: ConsoleQueries) -> HttpResponse:
        params = params_of(request.GET, ("q", "state", "job", "limit"))
        text = params.get("q", "")
        if text and queries.tries_of(text):
            # A task id goes straight to its history, as the console's search does.
            name = "admin:celery_recovery_try_task"
            return HttpResponseRedirect(reverse(name, args=[text], current_app=request.current_app))
        # Every try newest first would sort the whole table (no index on queued_at, 0.4 s
        # at a million tries): as the console's search, the list waits for a choice.
        narrowed = bool(text or params.get("state") or params.get("job"))
        found = Page([], None)
        if narrowed:
            found = queries.tries(
                params.get("before"),
                limit_of(params),
                task_name=text or None,
                state=params.get("state"),
                job_id=params.get("job"),
            )
        context = {
            "rows": found.rows,
            "q": text,
            "narrowed": narrowed,
            "params": params,
            "filters": [choices(params, "state", "state", [s.value for s in TaskState])],
            "active": active(params, {"job": "process (job)"}),
            "pager": pager(params, found.next_before),
        }
        return self.render(request, "tries.html", context, queries=queries)

    def history(self, request: HttpRequest, queries: ConsoleQueries, task_id: str) -> HttpResponse:
        task = queries.task(task_id)
        context: dict[str, Any] = {"task_id": task_id, "crumb": task_id}
        if task is None:
            context["title"] = "No such task"
            return self.render(request, "missing.html", context, status=404, queries=queries)
        context.update(task=task, title=task["task_name"])
        return self.render(request, "task.html", context, queries=queries)


@admin.register(Recovery)
class RecoveryAdmin(StorePageAdmin):
    """The recovery audit log, newest first, by action, reason, task or host."""

    def page(self, request: HttpRequest, queries: ConsoleQueries) -> HttpResponse:
        params = params_of(request.GET, ("action", "reason", "task_id", "hostname", "limit"))
        found = queries.recoveries(
            before=params.get("before"),
            limit=limit_of(params),
            action=params.get("action"),
            reason=params.get("reason"),
            task_id=params.get("task_id"),
            hostname=params.get("hostname"),
        )
        context = {
            "rows": found.rows,
            "filters": [
                choices(params, "action", "action", [a.value for a in AuditAction]),
                choices(params, "reason", "reason", [r.value for r in AuditReason]),
            ],
            "active": active(params, {"task_id": "task", "hostname": "host"}),
            "pager": pager(params, found.next_before),
        }
        return self.render(request, "recoveries.html", context, queries=queries)


@admin.register(Job)
class JobAdmin(StorePageAdmin):
    """Every process that took part, live or ended, with its heartbeat's age."""

    def page(self, request: HttpRequest, queries: ConsoleQueries) -> HttpResponse:
        params = params_of(request.GET, ("type", "state", "limit"))
        found = queries.jobs(
            utcnow(),
            before=params.get("before"),
            limit=limit_of(params),
            job_type=params.get("type"),
            state=params.get("state"),
        )
        for job in found.rows:
            # Late as the sweeps judge it: a running job past its type's threshold.
            job["late"] = job["state"] == JobState.RUNNING and (
                job["heartbeat_age"] > job["threshold"]
            )
        context = {
            "rows": found.rows,
            "filters": [
                choices(params, "type", "type", [t.value for t in JobType]),
                choices(params, "state", "state", [s.value for s in JobState]),
            ],
            "pager": pager(params, found.next_before),
        }
        return self.render(request, "jobs.html", context, queries=queries)


@admin.register(Schedule)
class ScheduleAdmin(StorePageAdmin):
    """The HA beat's entries (celery_recovery.beat:Scheduler) and which beat leads."""

    def page(self, request: HttpRequest, queries: ConsoleQueries) -> HttpResponse:
        data = schedules(queries.store, utcnow())
        context = {"rows": data["rows"], "leader": data["leader"]}
        return self.render(request, "schedules.html", context, queries=queries)
