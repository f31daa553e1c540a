"""The Cookie header of a new signed-in user, made in the database a server's environment names.

The bench's servers run in their own processes, each on its own SQLite and var directory (hence
its own development secret key). A socket the bench opens on one must carry a session of that
server's database, so the session is made by a child process run with the server's environment:

    python -m bench.session_cookie LABEL      # prints the Cookie header
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.processes import ROOT


def signed_in(env: dict[str, str], label: str) -> str:
    """A new user's session cookie in the database of the server that runs with `env`."""
    argv = [sys.executable, "-m", "bench.session_cookie", label]
    done = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, **env}, check=True, capture_output=True, text=True
    )
    return done.stdout.strip().splitlines()[-1]


def main(label: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from bench.stream_server import create_viewers

    print(create_viewers(label, 1)[0].cookie)


if __name__ == "__main__":
    main(sys.argv[1])
