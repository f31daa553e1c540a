"""A pool process leaves what it inherited out of its garbage collections (config/celery.py).

Celery's retries leave reference cycles that only a full collection frees; in a process that
inherited ~480,000 objects those collections came so rarely that the soak's pool process grew
by megabytes a minute, and each one copied the shared pages it walked.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.processes import child_env

PROBE = """
import gc
import json

import django

django.setup()
import config.celery
from celery.signals import worker_process_init

before = gc.get_freeze_count()
worker_process_init.send(sender=None)
frozen = gc.get_freeze_count()


class Node:
    pass


cycle = Node()
cycle.me = cycle
del cycle
print(json.dumps({"before": before, "frozen": frozen, "collected": gc.collect()}))
"""


def test_a_pool_process_freezes_what_it_inherited_and_still_collects_new_cycles():
    env = child_env(DJANGO_SETTINGS_MODULE="config.settings")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["before"] == 0
    assert probe["frozen"] > 50_000  # Django, Celery and the app: left out from now on
    assert probe["collected"] >= 1  # the new cycle is freed
