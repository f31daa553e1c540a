"""The development secret key: generated once and kept under var/, never used when DEBUG is off."""

from __future__ import annotations

from pathlib import Path

from django.core.management.utils import get_random_secret_key


def dev_secret_key(path: Path) -> str:
    """Read the dev key, creating it on first use so sessions survive restarts."""
    if path.is_file():
        key = path.read_text().strip()
        if key:
            return key
    path.parent.mkdir(parents=True, exist_ok=True)
    key = get_random_secret_key()
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key
