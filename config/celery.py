"""The Celery app: broker and settings come from Django settings under the CELERY namespace."""

import gc
import os

from celery import Celery
from celery.signals import worker_process_init

from config.logging import connect_celery_signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("tandem")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
connect_celery_signals()


@worker_process_init.connect
def freeze_inherited_objects(**_: object) -> None:
    """Leave the objects a pool process inherits out of its garbage collections.

    A forked pool process starts with the ~480,000 objects of the worker that forked it. A
    full collection walks them all, which writes to each one's header and so copies every
    page it touches out of the memory the two processes share; and Python runs one only once
    the objects that survived younger collections number a quarter of those the last full
    one kept, so the cycles each Celery retry leaves behind (~3,000 objects) piled up by the
    ten thousand in between. Frozen, they are never walked, and the collection right after
    counts only what is left: full collections stay cheap and frequent, and the shared
    pages stay shared.
    """
    gc.freeze()
    gc.collect()
