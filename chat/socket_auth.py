"""The sockets' session authentication, closing cleanly while the database is unavailable.

Channels' `AuthMiddleware` loads the session and its user before any consumer runs; with the
database down that query raised inside Daphne, which logged a traceback and refused the
handshake, so the page could not tell why. Here the socket is accepted and closed at once
with `DATABASE_UNAVAILABLE`, which the page (`static/js/chat/connection.js`) answers by
reconnecting later; the consumer does the same when its own reads find the database gone.
The user is read on the readers' thread, which keeps its database connection
(`chat.kept_connections`), not by Channels' `get_user` on the process's shared thread.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from channels.auth import AuthMiddleware
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.contrib.auth import get_user
from django.db import InterfaceError, OperationalError

from chat.kept_connections import readers

log = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = 4503  # the page reconnects later, as after a lost connection
# The errors of a database that is down or whose connection died (not a bad query).
UNAVAILABLE_ERRORS = (OperationalError, InterfaceError)
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


def refused(path: str, exc: Exception) -> None:
    """One line in the log for a socket closed because the database is unavailable."""
    log.warning(
        "websocket %s closed with %s: database unavailable (%s)", path, DATABASE_UNAVAILABLE, exc
    )


class SessionAuthMiddleware(AuthMiddleware):
    """`AuthMiddleware` that closes the socket with 4503 when the user cannot be loaded."""

    async def resolve_scope(self, scope: dict) -> None:
        scope["user"]._wrapped = await readers.run(session_user, scope["session"])

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> Any:
        scope = dict(scope)
        self.populate_scope(scope)
        try:
            await self.resolve_scope(scope)
        except UNAVAILABLE_ERRORS as exc:
            refused(scope.get("path", ""), exc)
            return await close_unavailable(receive, send)
        return await self.inner(scope, receive, send)


def session_user(session: Any) -> Any:
    """The session's user, checked as Django's request middleware checks it (the session's
    auth hash; a session that no longer matches is flushed), or AnonymousUser."""
    return get_user(SimpleNamespace(session=session))


async def close_unavailable(receive: Receive, send: Send) -> None:
    """Accept the handshake and close at once, so the browser sees the code, not a bare 403."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": DATABASE_UNAVAILABLE})


def session_auth_stack(inner: Any) -> CookieMiddleware:
    """Cookies, the session and the user, as `channels.auth.AuthMiddlewareStack`."""
    return CookieMiddleware(SessionMiddleware(SessionAuthMiddleware(inner)))
