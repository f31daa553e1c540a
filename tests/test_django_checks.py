"""Django's own checks, in development and under production settings."""

import subprocess
import sys

import pytest
from django.core.management import call_command

from tests.support.processes import ROOT, child_env

PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "x7$k2!pq9-tandem-production-like-secret-key-for-the-deploy-check-0123456789",
    "ALLOWED_HOSTS": "chat.example.com",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run manage.py in a fresh process with the given environment overrides."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_system_checks_pass():
    call_command("check", fail_level="WARNING")


@pytest.mark.django_db
def test_migrations_are_complete():
    call_command("makemigrations", check=True, dry_run=True)


def test_deploy_checks_pass_in_production_mode():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key():
    result = manage("check", DEBUG="0", SECRET_KEY="", ALLOWED_HOSTS="chat.example.com")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
    assert "Traceback" not in result.stderr


def test_production_refuses_to_start_without_allowed_hosts():
    result = manage("check", **{**PRODUCTION, "ALLOWED_HOSTS": ""})
    assert result.returncode != 0
    assert "ALLOWED_HOSTS must be set" in result.stderr


def test_a_malformed_boolean_names_the_variable():
    result = manage("check", DEBUG="maybe")
    assert result.returncode != 0
    assert "DEBUG must be a boolean" in result.stderr


def test_deploy_check_warns_when_the_api_is_declared_open():
    result = manage(
        "check", "--deploy", "--fail-level", "WARNING", **PRODUCTION, TANDEM_API_OPEN="1"
    )
    assert result.returncode != 0
    assert "tandem.W001" in result.stderr + result.stdout
    assert "TANDEM_API_OPEN=1 serves the generation API without any key" in result.stderr
