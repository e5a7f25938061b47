"""The console's ASGI app: each page at ``/<page>`` and its JSON twin at ``/api/<page>``.

Both are built from the same query result, so the JSON is exactly what the
page shows.  Handlers are plain ``def``: Starlette runs them in its thread
pool, where the blocking database driver belongs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from celery_recovery.core.audit import AuditAction, AuditReason
from celery_recovery.core.errors import StoreError
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.states import JobState, JobType
from celery_recovery.core.timeutils import utcnow
from celery_recovery.web import chart
from celery_recovery.web.queries import ConsoleQueries, Page
from celery_recovery.web.readonly import ReadOnlyStore
from celery_recovery.web.schedules import schedules
from celery_recovery.web.security import Access, SecurityMiddleware

HERE = Path(__file__).parent
#: Seconds between two reloads of a page when auto-refresh is on.
REFRESH_SECONDS = 5


@dataclass
class Console:
    """What the console serves: the store's queries, and where to read locks."""

    queries: ConsoleQueries
    redis_url: str | None = None
    locks_reader: Callable[[str, datetime], list[dict[str, Any]]] | None = field(
        default=None, repr=False
    )


class ConsoleJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=_jsonable, separators=(",", ":")).encode()


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def create_app(
    settings: RecoverySettings,
    *,
    show_args: bool = False,
    database_url: str | None = None,
) -> Starlette:
    """The console over the store of ``settings`` (or ``database_url``)."""
    store = ReadOnlyStore(database_url or settings.database_url, settings.database_pooler)
    console = Console(ConsoleQueries(store, settings, show_args), settings.redis_url)
    templates = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates.globals.update(
        store_url=store.masked_url,
        refresh_seconds=REFRESH_SECONDS,
        actions=[a.value for a in AuditAction],
        reasons=[r.value for r in AuditReason],
        job_types=[t.value for t in JobType],
        job_states=[s.value for s in JobState],
        show_args=show_args,
    )
    templates.filters["when"] = _when
    templates.filters["pretty"] = lambda v: json.dumps(v, default=_jsonable, indent=1)

    def page(name: str, build: Callable[[Request], dict[str, Any] | Response]) -> list[Route]:
        def html(request: Request) -> Response:
            try:
                data = build(request)
            except StoreError as exc:
                return _unavailable(templates, name, exc)
            if isinstance(data, Response):
                return data
            body = templates.get_template(f"{name}.html").render(
                page=name, data=data, query=dict(request.query_params), request=request
            )
            return HTMLResponse(body)

        def api(request: Request) -> Response:
            try:
                data = build(request)
            except StoreError as exc:
                return ConsoleJSON({"error": str(exc)}, status_code=503)
            if isinstance(data, Response):
                return ConsoleJSON({"error": "not found"}, status_code=404)
            return ConsoleJSON(data)

        path = "/" if name == "overview" else f"/{name}"
        return [Route(path, html, name=name), Route(f"/api/{name}", api, name=f"api_{name}")]

    routes = [
        *page("overview", lambda r: _overview(console)),
        *page("recoveries", lambda r: _recoveries(console, r)),
        *page("tasks", lambda r: _search(console, r)),
        *page("jobs", lambda r: _jobs(console, r)),
        *page("deferred", lambda r: _listing(console.queries.deferred, r, "queue")),
        *page("callbacks", lambda r: _listing(console.queries.callbacks, r)),
        *page("locks", lambda r: _locks(console)),
        *page("schedules", lambda r: schedules(console.queries.store, utcnow())),
        *_task_routes(console, templates),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        store.dispose()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.console = console
    return app


def secured(app: Starlette, settings: RecoverySettings, host: str) -> SecurityMiddleware:
    """``app`` behind authentication and security headers; refuses an exposed bind without
    a secret (raises :class:`~celery_recovery.core.errors.ConfigurationError`)."""
    access = Access(settings.web_token, settings.web_credentials)
    access.check_bind(host)
    return SecurityMiddleware(app, access)


# -- page data ------------------------------------------------------------------------


def _overview(console: Console) -> dict[str, Any]:
    now = utcnow()
    data = console.queries.overview(now)
    data["overdue"] = console.queries.overdue(now)
    bars, peak = chart.bars(data["recoveries_per_hour"])
    data["chart"] = {"bars": [b.__dict__ for b in bars], "peak": peak}
    data["chart"].update(width=chart.WIDTH, height=chart.HEIGHT, axis=chart.AXIS)
    return data


def _recoveries(console: Console, request: Request) -> dict[str, Any]:
    q = request.query_params
    page = console.queries.recoveries(
        before=q.get("before"),
        limit=_limit(q.get("limit")),
        action=q.get("action"),
        reason=q.get("reason"),
        task_id=q.get("task_id"),
        hostname=q.get("hostname"),
    )
    return page.as_dict()


def _search(console: Console, request: Request) -> dict[str, Any] | Response:
    q = request.query_params
    text = (q.get("q") or "").strip()
    if not text:
        return {"q": "", **Page([], None).as_dict()}
    found = console.queries.search(text, q.get("before"), _limit(q.get("limit")))
    ids = {row["task_id"] for row in found.rows}
    if not request.url.path.startswith("/api/") and ids == {text}:
        return RedirectResponse(request.url_for("task", task_id=text).path, 303)
    return {"q": text, **found.as_dict()}


def _jobs(console: Console, request: Request) -> dict[str, Any]:
    q = request.query_params
    page = console.queries.jobs(
        utcnow(),
        before=q.get("before"),
        limit=_limit(q.get("limit")),
        job_type=q.get("type"),
        state=q.get("state"),
    )
    return page.as_dict()


def _listing(query: Callable[..., Page], request: Request, *filters: str) -> dict[str, Any]:
    q = request.query_params
    extra = {name: q.get(name) for name in filters}
    return query(before=q.get("before"), limit=_limit(q.get("limit")), **extra).as_dict()


def _locks(console: Console) -> dict[str, Any]:
    if not console.redis_url:
        return {"rows": [], "redis": None, "error": "no Redis configured (recovery_redis_url)"}
    from celery_recovery.core.urls import mask_url
    from celery_recovery.locks.inspect import held_locks

    read = console.locks_reader or held_locks
    try:
        rows = read(console.redis_url, utcnow())
    except Exception as exc:  # Redis down or refusing: the page says so, the console stays up
        return {"rows": [], "redis": mask_url(console.redis_url), "error": str(exc)}
    return {"rows": rows, "redis": mask_url(console.redis_url), "error": None}


def _task_routes(console: Console, templates: Environment) -> list[Route]:
    def build(request: Request) -> dict[str, Any] | None:
        return console.queries.task(request.path_params["task_id"])

    def html(request: Request) -> Response:
        try:
            data = build(request)
        except StoreError as exc:
            return _unavailable(templates, "tasks", exc)
        if data is None:
            body = templates.get_template("missing.html").render(
                page="tasks", task_id=request.path_params["task_id"]
            )
            return HTMLResponse(body, status_code=404)
        return HTMLResponse(templates.get_template("task.html").render(page="tasks", data=data))

    def api(request: Request) -> Response:
        try:
            data = build(request)
        except StoreError as exc:
            return ConsoleJSON({"error": str(exc)}, status_code=503)
        if data is None:
            return ConsoleJSON({"error": "no such task"}, status_code=404)
        return ConsoleJSON(data)

    return [
        Route("/tasks/{task_id:path}", html, name="task"),
        Route("/api/tasks/{task_id:path}", api, name="api_task"),
    ]


def _unavailable(templates: Environment, name: str, exc: StoreError) -> Response:
    body = templates.get_template("unavailable.html").render(page=name, error=str(exc))
    return HTMLResponse(body, status_code=503)


def _limit(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return "" if value is None else str(value)
