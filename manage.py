#!/usr/bin/env python
"""Django's command-line utility for Tandem."""

import os
import sys


def main() -> None:
    """Run a management command with Tandem's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        sys.exit(f"Configuration error: {exc}")


if __name__ == "__main__":
    main()
