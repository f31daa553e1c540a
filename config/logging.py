"""Structured logs: one line per event, JSON in production, readable text in development.

Every line carries the ids bound to the code that logs it: `request_id` (one per HTTP request
or WebSocket connection, carried into the Celery tasks that request sends), `message_id`,
`part_id` and `task_id`. So one turn can be followed from the web process through the
engine's writer thread to the worker with one grep or jq on its request_id (docs/
observability.md). The ids live in one ContextVar: asyncio tasks and asgiref's
sync_to_async carry it along, plain threads do not (chat/text_stream.py copies it).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from types import MappingProxyType

from celery import signals

FIELDS = ("request_id", "message_id", "part_id", "task_id")
# What a task inherits from the code that sent it; its own task_id it gets from Celery.
CARRIED = ("request_id", "message_id", "part_id")
HEADER = "tandem_log_context"
# A caller's X-Request-ID is kept only when it cannot break a log line or a header.
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

_ids: ContextVar[Mapping[str, object]] = ContextVar("tandem_log_ids", default=MappingProxyType({}))
_task_tokens: dict[str, Token] = {}


def bind(**ids: object) -> Token:
    """Add ids to the current context until it ends or `reset` is called with the token."""
    return _ids.set({**_ids.get(), **ids})


def reset(token: Token) -> None:
    """Put the ids back as they were before the `bind` that returned `token`."""
    _ids.reset(token)


@contextmanager
def bound(**ids: object) -> Iterator[None]:
    """The ids for the lines logged inside the block; ids `bind`-ed inside it end with it too."""
    token = bind(**ids)
    try:
        yield
    finally:
        reset(token)


def current() -> dict[str, object]:
    """The ids bound now."""
    return dict(_ids.get())


def request_id_from(header: str | None) -> str:
    """The caller's request id when it is sane (short, no spaces or controls), else a new one."""
    if header and SANE_REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


class ContextFilter(logging.Filter):
    """Puts the bound ids on every record; ids a call passed itself (`extra=`) win."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _ids.get().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class PlainFormatter(logging.Formatter):
    """Development's line: the usual text, then the ids in brackets so they can be grepped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        ids = " ".join(
            f"{name}={getattr(record, name)}"
            for name in FIELDS
            if getattr(record, name, None) is not None
        )
        line = super().formatMessage(record)
        return f"{line} [{ids}]" if ids else line


def _use_django_logging(**kwargs) -> None:
    """Celery workers and beat log through settings.LOGGING, not Celery's own format."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)


def _send_ids(headers: dict | None = None, **kwargs) -> None:
    """A task sent from a request (or from another task) carries that request's ids."""
    carried = {name: value for name, value in _ids.get().items() if name in CARRIED}
    if headers is not None and carried:
        headers.setdefault(HEADER, carried)


def _task_started(task_id: str, task, **kwargs) -> None:
    carried = getattr(task.request, HEADER, None) or {}
    ids = {name: carried[name] for name in CARRIED if name in carried}
    _task_tokens[task_id] = bind(**ids, task_id=task_id)


def _task_finished(task_id: str, **kwargs) -> None:
    token = _task_tokens.pop(task_id, None)
    if token is not None:
        reset(token)


def connect_celery_signals() -> None:
    """Wire the ids into Celery: sent with each task, bound while the worker runs it."""
    signals.setup_logging.connect(_use_django_logging, dispatch_uid="tandem-logging")
    signals.before_task_publish.connect(_send_ids, dispatch_uid="tandem-log-ids-send")
    signals.task_prerun.connect(_task_started, dispatch_uid="tandem-log-ids-start")
    signals.task_postrun.connect(_task_finished, dispatch_uid="tandem-log-ids-end")
