"""The Celery app: broker and settings come from Django settings under the CELERY namespace."""

import os

from celery import Celery

from config.logging import connect_celery_signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("tandem")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
connect_celery_signals()
