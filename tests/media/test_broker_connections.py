"""Request threads sending image tasks at once keep one broker connection in the process
(`media.services.send_render`): counted by a private redis-server's client list."""

import threading
import uuid

import redis

from media.services import send_render
from tests.support.media import celery_broker, new_redis_server


def broker_clients(url: str) -> int:
    """Clients of the server, this count's own connection left out."""
    with redis.Redis.from_url(url) as client:
        return len(client.client_list()) - 1


def test_threads_sending_at_once_share_one_broker_connection(tmp_path):
    server = new_redis_server(tmp_path).start()
    try:
        with celery_broker(server.url):
            send_render(0, str(uuid.uuid4()))
            one_sender = broker_clients(server.url)
            start, errors = threading.Barrier(8), []

            def burst() -> None:
                start.wait()
                try:
                    for _ in range(25):
                        send_render(0, str(uuid.uuid4()))
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
        server.stop()
