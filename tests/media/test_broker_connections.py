"""Sending image tasks from many threads at once keeps one broker connection per process
(`CELERY_BROKER_POOL_LIMIT`): counted by a private redis-server's client list."""

import threading

import redis
from celery import Celery

from media.services import RENDER_TASK
from tests.support.media import new_redis_server


def broker_clients(url: str) -> int:
    """Clients of the server, this count's own connection left out."""
    with redis.Redis.from_url(url) as client:
        return len(client.client_list()) - 1


def test_threads_sending_at_once_share_one_broker_connection(tmp_path):
    server = new_redis_server(tmp_path).start()
    app = Celery("burst", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.broker_url = server.url
    try:

        def send() -> None:
            app.send_task(RENDER_TASK, args=[0], ignore_result=True)

        send()
        one_sender = broker_clients(server.url)
        start, errors = threading.Barrier(8), []

        def burst() -> None:
            start.wait()
            try:
                for _ in range(25):
                    send()
            except Exception as exc:  # noqa: BLE001 - any failure fails the test below
                errors.append(exc)

        threads = [threading.Thread(target=burst) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        with redis.Redis.from_url(server.url) as client:
            assert client.llen("media") == 201  # every task sent
        assert broker_clients(server.url) == one_sender
    finally:
        app.close()
        server.stop()
