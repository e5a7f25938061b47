"""A page over the celery-recovery store in Django's admin, where a model's changelist
would be: read-only, behind one permission, and an answer even when the store is down.

The admin's own wrapper (``admin_site.admin_view``) sends anonymous users and
non-staff to the login page; a staff user without the permission gets 403.
Only GET and HEAD are answered (405 otherwise): there is nothing to add, change
or delete, and no URL for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.views.decorators.http import require_safe

from celery_recovery.contrib.django.models import VIEW_PERMISSION
from celery_recovery.contrib.django.store import console_queries
from celery_recovery.core.errors import RecoveryError, StoreError
from celery_recovery.core.urls import mask_secrets
from celery_recovery.web.queries import ConsoleQueries

#: Builds a page's response from the request and the console's queries (and URL arguments).
PageBuilder = Callable[..., HttpResponse]


class StorePageAdmin(admin.ModelAdmin):
    """The admin of one page's stand-in model (models.py): its URL is the changelist's."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return bool(user.is_active and user.is_staff and user.has_perm(VIEW_PERMISSION))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.page_view(self.page), name=name), *self.more_urls()]

    def more_urls(self) -> list[URLPattern]:
        """URLs of the page's other views (a task's history under Tries)."""
        return []

    def page(self, request: HttpRequest, queries: ConsoleQueries) -> HttpResponse:
        raise NotImplementedError

    def page_view(self, build: PageBuilder) -> Callable[..., HttpResponse]:
        """``build`` as an admin view: permission first, then the store, whose failure is
        a page saying what failed (503), never a server error."""

        @require_safe
        def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            if not self.has_view_permission(request):
                raise PermissionDenied
            request.current_app = self.admin_site.name
            try:
                return build(request, console_queries(), **kwargs)
            except RecoveryError as exc:
                # StoreError: the store failed; any other: no app, or settings refused.
                found = isinstance(exc, StoreError)
                title = "did not answer" if found else "could not be found"
                context = {"title": f"The celery-recovery store {title}"}
                context["error"] = mask_secrets(str(exc))
                return self.render(request, "unavailable.html", context, status=503)

        return self.admin_site.admin_view(view)

    def render(
        self,
        request: HttpRequest,
        template: str,
        context: dict[str, Any],
        status: int = 200,
        queries: ConsoleQueries | None = None,
    ) -> TemplateResponse:
        """``admin/celery_recovery/<template>`` in the admin's frame (header, sidebar,
        breadcrumbs), titled after the page unless ``context`` says otherwise."""
        return TemplateResponse(
            request,
            f"admin/celery_recovery/{template}",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "title": str(self.opts.verbose_name_plural).capitalize(),
                "store_url": queries.store.masked_url if queries else None,
                **context,
            },
            status=status,
        )


def limit_of(params: dict[str, str]) -> int | None:
    """The page size asked for (the console's ``?limit=``; it bounds it)."""
    value = params.get("limit", "")
    return int(value) if value.isdigit() else None
