"""The worker's consumer: it reconnects to a lost broker at most a second apart.

Celery's consumer retries a lost broker connection 2, 4, 6 … up to 30 s apart (kombu's
defaults, which no setting reaches), so after a 30 s Redis outage a worker came back up to
12 s after Redis did while the images sent again waited in the queue. Settings name this
class as CELERY_WORKER_CONSUMER.
"""

from __future__ import annotations

import functools

from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection

RECONNECT = {"interval_start": 0.5, "interval_step": 0.5, "interval_max": 1.0}


class Consumer(CeleryConsumer):
    """Celery's consumer with the reconnect intervals of RECONNECT."""

    def ensure_connected(self, conn: Connection) -> Connection:
        # Celery calls conn.ensure_connection(errback, max_retries, callback=…) with kombu's
        # default intervals; this connection's call gets ours instead.
        conn.ensure_connection = functools.partial(conn.ensure_connection, **RECONNECT)
        return super().ensure_connected(conn)
