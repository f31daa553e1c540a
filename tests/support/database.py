"""The URL of the test database, for the server and worker processes a test starts."""

from __future__ import annotations

from urllib.parse import quote

from django.db import connections


def test_database_url() -> str:
    """DATABASE_URL pointing at this process's database: the one pytest-django created for
    the run, or the one a test pointed the ORM at (a chaos scenario's own cluster)."""
    db = connections["default"].settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    if db["ENGINE"] in ("config.postgres", "django.db.backends.postgresql"):
        auth = quote(db.get("USER") or "")
        if db.get("PASSWORD"):
            auth += ":" + quote(db["PASSWORD"])
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 5432
        return f"postgres://{auth}@{host}:{port}/{db['NAME']}"
    raise NotImplementedError(f"no URL form for {db['ENGINE']}")
