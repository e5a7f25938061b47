"""What the test tasks leave in Django's database, read back by the tests."""

from django.db import models


class BodyRun(models.Model):
    """One start of a task's body (a killed body and its re-run are two rows)."""

    task_id = models.CharField(max_length=255, db_index=True)
    label = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField(auto_now_add=True)


class FailureSeen(models.Model):
    """A task's ``on_failure``, wherever it ran (a worker, or our sweeper for a killed task)."""

    task_id = models.CharField(max_length=255, db_index=True)
    exception = models.TextField()
    pid = models.IntegerField()
