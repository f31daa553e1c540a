"""A Celery worker never loads the model's libraries: importing the tasks leaves torch out."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import child_env

PROBE = """
import sys
import django

django.setup()
import media.tasks

print(sorted(name for name in ("torch", "transformers") if name in sys.modules))
"""


def test_importing_media_tasks_loads_neither_torch_nor_transformers():
    env = child_env(DJANGO_SETTINGS_MODULE="config.settings")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
