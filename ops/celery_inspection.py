"""Celery and its broker as an operator sees them: workers, their tasks, the media queue depth,
and the recent image failures with their reasons.

Every broker probe uses a connection of its own with short socket timeouts and no retries, so
a dead Redis answers in milliseconds and silent workers cost one inspect timeout; the ops page
never hangs on them. Workers are found with `inspect().ping()` (broadcast, waits the whole
timeout); `active` and `reserved` then go only to the workers that answered, and return as
soon as each of them has.
"""

from __future__ import annotations

from typing import Any

import redis
from amqp.exceptions import ChannelError
from django.conf import settings
from kombu import Connection
from kombu.exceptions import KombuError

from chat.models import Part
from config.celery import app
from media.models import SweeperAction

RECENT_FAILURES = 10


def broker_connection(timeout: float) -> Connection:
    """A connection to the broker that gives up after `timeout` instead of retrying."""
    options = {
        **app.conf.broker_transport_options,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "max_retries": 0,
        "interval_start": 0,
    }
    return app.connection_for_write(connect_timeout=timeout, transport_options=options)


def queue_depth(connection: Connection, queue: str) -> int:
    """Messages waiting in `queue`, summed over the lists kombu keeps per priority step."""
    try:
        return connection.default_channel.queue_declare(queue, passive=True).message_count
    except ChannelError:  # kombu's "no such queue": Redis drops an empty list
        return 0


def task_summary(worker: str, task: dict[str, Any]) -> dict[str, Any]:
    """The fields of an inspect reply an operator reads: which task, on what, where."""
    return {
        "worker": worker,
        "id": task.get("id"),
        "name": task.get("name") or task.get("type"),
        "args": task.get("args"),
    }


def flatten(replies: dict[str, list[dict]] | None) -> list[dict[str, Any]]:
    return [
        task_summary(worker, task)
        for worker, tasks in sorted((replies or {}).items())
        for task in tasks
    ]


def celery_overview(timeout: float) -> dict[str, Any]:
    """Workers online, their active and reserved tasks, and the media queue's depth.

    state is "ok" when the broker answered (even with no worker), "error" when it did not.
    """
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    try:
        with broker_connection(timeout) as connection:
            depth = queue_depth(connection, queue)
            pongs = app.control.inspect(timeout=timeout, connection=connection).ping() or {}
            workers = sorted(pongs)
            active: dict = {}
            reserved: dict = {}
            if workers:
                targeted = app.control.inspect(
                    destination=workers, timeout=timeout, connection=connection
                )
                active = targeted.active() or {}
                reserved = targeted.reserved() or {}
    except (OSError, KombuError, redis.RedisError) as exc:
        return {
            "state": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "queue": queue,
            "queue_depth": None,
            "workers": [],
            "active": [],
            "reserved": [],
        }
    return {
        "state": "ok",
        "queue": queue,
        "queue_depth": depth,
        "workers": workers,
        "active": flatten(active),
        "reserved": flatten(reserved),
    }


def recent_failures(limit: int = RECENT_FAILURES) -> dict[str, list[dict[str, Any]]]:
    """The newest failed images with their reasons, and the sweeper's newest repairs."""
    images = (
        Part.objects.filter(kind=Part.Kind.IMAGE, state=Part.State.FAILED)
        .order_by("-updated_at", "-pk")
        .values("pk", "message_id", "message__conversation_id", "error", "attempt", "updated_at")[
            :limit
        ]
    )
    sweeps = SweeperAction.objects.order_by("-created_at", "-pk")[:limit]
    return {
        "images": [
            {
                "part": row["pk"],
                "message": row["message_id"],
                "conversation": row["message__conversation_id"],
                "error": row["error"],
                "attempt": row["attempt"],
                "at": row["updated_at"],
            }
            for row in images
        ],
        "sweeper": [
            {
                "action": action.action,
                "label": action.get_action_display(),
                "part": action.part_id,
                "detail": action.detail,
                "at": action.created_at,
            }
            for action in sweeps
        ],
    }
