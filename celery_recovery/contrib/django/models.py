"""Stand-ins for the admin pages: unmanaged models with no table.

The pages read the celery-recovery store, another database than Django's, through
the console's queries (admin.py); these models only give the admin its index
entries (one per page) and give Django the permission that opens them.
"""

from django.db import models

#: The permission that opens every page, as ``user.has_perm`` spells it.
VIEW_PERMISSION = "celery_recovery.view_recovery"


class StorePage(models.Model):
    class Meta:
        abstract = True
        managed = False
        # No add, change or delete: nothing here is written, through the admin or else.
        default_permissions = ()


class Try(StorePage):
    """One try of a task: its state, the process that ran it, the task's history."""

    class Meta(StorePage.Meta):
        db_table = "celery_recovery_try"
        verbose_name = "try"
        verbose_name_plural = "tries"


class Recovery(StorePage):
    """One row of the recovery audit log; carries the pages' permission."""

    class Meta(StorePage.Meta):
        db_table = "celery_recovery_recovery"
        verbose_name = "recovery"
        verbose_name_plural = "recoveries"
        permissions = [("view_recovery", "Can view the celery-recovery pages")]


class Job(StorePage):
    """A worker, beat or triggerer process, with its heartbeat."""

    class Meta(StorePage.Meta):
        db_table = "celery_recovery_job"
        verbose_name = "job"
        verbose_name_plural = "jobs"


class Schedule(StorePage):
    """An entry of the HA beat's schedule."""

    class Meta(StorePage.Meta):
        db_table = "celery_recovery_schedule"
        verbose_name = "schedule"
        verbose_name_plural = "schedules"
