"""The pages' stand-in models (no table: unmanaged) and their permission, which
``manage.py migrate`` creates."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Job",
            fields=[
                (
                    "id",
                    models.AutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
            ],
            options={
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
                "db_table": "celery_recovery_job",
                "abstract": False,
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="Recovery",
            fields=[
                (
                    "id",
                    models.AutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
            ],
            options={
                "verbose_name": "recovery",
                "verbose_name_plural": "recoveries",
                "db_table": "celery_recovery_recovery",
                "permissions": [("view_recovery", "Can view the celery-recovery pages")],
                "abstract": False,
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="Schedule",
            fields=[
                (
                    "id",
                    models.AutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
            ],
            options={
                "verbose_name": "schedule",
                "verbose_name_plural": "schedules",
                "db_table": "celery_recovery_schedule",
                "abstract": False,
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="Try",
            fields=[
                (
                    "id",
                    models.AutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
            ],
            options={
                "verbose_name": "try",
                "verbose_name_plural": "tries",
                "db_table": "celery_recovery_try",
                "abstract": False,
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
