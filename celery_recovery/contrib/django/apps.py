from django.apps import AppConfig


class CeleryRecoveryConfig(AppConfig):
    name = "celery_recovery.contrib.django"
    label = "celery_recovery"
    verbose_name = "Celery recovery"
    # The models are unmanaged stand-ins (models.py); this keeps a project without
    # DEFAULT_AUTO_FIELD from being warned about them.
    default_auto_field = "django.db.models.AutoField"
