"""Settings read from the environment."""

import json
import subprocess
import sys

from tests.support.processes import ROOT, child_env

PROBE = """
import django, json
django.setup()
from django.conf import settings as s
db = s.DATABASES["default"]
layer = s.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"]
print(json.dumps({
    "db": db["ENGINE"], "name": str(db["NAME"]), "redis": s.REDIS_URL,
    "broker": s.CELERY_BROKER_URL, "layer": layer,
    "media": str(s.MEDIA_ROOT), "model": s.TANDEM_MODEL, "dtype": s.TANDEM_DTYPE,
    "weights": s.TANDEM_WEIGHTS,
}))
"""


def load_settings(**env: str) -> subprocess.CompletedProcess:
    """Load the settings in a fresh process with `env`."""
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(DJANGO_SETTINGS_MODULE="config.settings", **env),
    )


def probe(**env: str) -> dict:
    """What the settings resolved to under `env`."""
    result = load_settings(**env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_embedded_defaults():
    seen = probe(DATABASE_URL="", REDIS_URL="", MEDIA_ROOT="", TANDEM_MODEL="", TANDEM_DTYPE="")
    assert seen["db"] == "django.db.backends.sqlite3"
    assert seen["name"].endswith("var/tandem.sqlite3")
    assert seen["redis"] == seen["broker"] == "redis://127.0.0.1:6379/0"
    assert seen["layer"] == "redis://127.0.0.1:6379/0"
    assert seen["media"].endswith("var/media")
    assert seen["model"] == "smollm2-135m-instruct"
    assert seen["dtype"] == "auto"
    assert seen["weights"] == "auto"


def test_environment_overrides():
    seen = probe(
        DATABASE_URL="postgres://u:p@db.internal:5433/tandem",
        REDIS_URL="redis://cache.internal:6380/2",
        MEDIA_ROOT="/srv/tandem-media",
        TANDEM_MODEL="/models/llama",
        TANDEM_DTYPE="bfloat16",
        TANDEM_WEIGHTS="Q4",
    )
    assert seen["db"] == "config.postgres"  # Django's backend behind config.probe_gate
    assert seen["name"] == "tandem"
    assert seen["broker"] == "redis://cache.internal:6380/2"
    assert seen["layer"] == "redis://cache.internal:6380/2"
    assert seen["media"] == "/srv/tandem-media"
    assert seen["model"] == "/models/llama"
    assert seen["dtype"] == "bfloat16"
    assert seen["weights"] == "q4"


def test_unknown_weights_setting_is_refused():
    result = load_settings(TANDEM_WEIGHTS="int3")
    assert result.returncode != 0
    assert "TANDEM_WEIGHTS must be auto, bf16, q4, int8, q8, q4_1 or fp16" in result.stderr
