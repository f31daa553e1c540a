"""Another process that keeps one CPU busy: the real load a measurement must notice."""

from __future__ import annotations

import subprocess
import sys

LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"


def spin(seconds: float) -> subprocess.Popen:
    """Start a process that spins on one CPU for `seconds` (wait() for its end)."""
    return subprocess.Popen([sys.executable, "-c", LOOP.format(seconds=seconds)])
