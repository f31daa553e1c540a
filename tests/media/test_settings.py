"""The media settings as a fresh process reads them from the environment."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.processes import ROOT, child_env

PROBE = """
import json
from config import settings as s
print(json.dumps({
    "backend": s.TANDEM_IMAGE_BACKEND, "rate": s.TANDEM_IMAGE_FAILURE_RATE,
    "soft": s.CELERY_TASK_SOFT_TIME_LIMIT, "hard": s.CELERY_TASK_TIME_LIMIT,
    "transport": s.CELERY_BROKER_TRANSPORT_OPTIONS, "beat": s.CELERY_BEAT_SCHEDULE,
}))
"""


def load(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(**env),
    )


def test_the_sweeper_is_scheduled_and_redelivery_waits_past_the_hard_limit():
    result = load(
        TANDEM_SWEEP_INTERVAL="7",
        TANDEM_IMAGE_SOFT_TIME_LIMIT="40",
        TANDEM_IMAGE_TIME_LIMIT="50",
        TANDEM_VISIBILITY_MARGIN="5",
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert (seen["backend"], seen["rate"], seen["soft"], seen["hard"]) == (
        "procedural",
        0.0,
        40,
        50,
    )
    assert seen["transport"]["visibility_timeout"] == 55
    sweep = seen["beat"]["sweep"]
    assert (sweep["task"], sweep["schedule"], sweep["options"]["expires"]) == ("media.sweep", 7, 7)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TANDEM_IMAGE_BACKEND": "dalle"}, "TANDEM_IMAGE_BACKEND must be procedural or diffusers"),
        ({"TANDEM_IMAGE_FAILURE_RATE": "1.5"}, "TANDEM_IMAGE_FAILURE_RATE must be between 0 and 1"),
        (
            {"TANDEM_IMAGE_SOFT_TIME_LIMIT": "90", "TANDEM_IMAGE_TIME_LIMIT": "90"},
            "TANDEM_IMAGE_SOFT_TIME_LIMIT must be below TANDEM_IMAGE_TIME_LIMIT",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_at_start(env, message):
    result = load(**env)
    assert result.returncode != 0 and message in result.stderr
