"""The test project works as a Django shop's does: a task through django-db."""

from __future__ import annotations

from typing import Any

import pytest

from tests.workers import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def test_a_task_of_the_project_stores_its_result_in_django_celery_results(
    django_orm: Any, start_django_worker: Any, django_client_app: Any
) -> None:
    from django_celery_results.models import TaskResult
    from shop.models import BodyRun

    start_django_worker()
    result = django_client_app.send_task("shop.tasks.work", args=["hello"])
    row = wait_for(
        lambda: TaskResult.objects.filter(task_id=result.id, status="SUCCESS").first(),
        what="the task's TaskResult",
    )
    assert row.result == '"hello"'
    assert BodyRun.objects.filter(task_id=result.id).count() == 1
