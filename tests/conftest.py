"""Fixtures that start real servers: Daphne, a Celery worker, Chromium."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.database import test_database_url
from tests.support.processes import BIN, Service, child_env, free_port, port_open, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Daphne:
    """A running Daphne serving config.asgi on the test database."""

    service: Service
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup) -> Iterator[None]:
    """pytest-django's test database; before it is dropped, the readers' threads of this
    process (in-process consumer and SSE tests) let their kept connections go."""
    from chat.kept_connections import readers

    yield
    readers.release()


@pytest.fixture(scope="session")
def service_logs(tmp_path_factory) -> Path:
    """One folder for the logs of every process the suite starts."""
    return tmp_path_factory.mktemp("service-logs")


def start_daphne(name: str, log_dir: Path, port: int | None = None, **env: str) -> Daphne:
    """Start Daphne on `port` (a free one by default) against the test database; wait until
    it listens. The same port again is a restart, as a browser's reconnect sees it."""
    port = port or free_port()
    environment = child_env(DATABASE_URL=test_database_url(), **env)
    endpoint = f"tcp:port={port}:interface=127.0.0.1:backlog=1024"  # as the Procfile's
    argv = [str(BIN / "daphne"), "-e", endpoint, "config.asgi:application"]
    service = Service(name, argv, environment, log_dir)
    try:
        wait_until(lambda: port_open(port) or not service.alive(), 60, f"{name} to listen")
    except TimeoutError:
        service.stop()
        raise
    assert service.alive(), service.log_text()
    return Daphne(service, port)


@contextmanager
def daphne_without_model(name: str, log_dir: Path) -> Iterator[Daphne]:
    """A Daphne that loads no model (protocol tests need none, and loading costs CPU),
    stopped when the block ends."""
    daphne = start_daphne(name, log_dir, TANDEM_LOAD_MODEL="0")
    try:
        yield daphne
    finally:
        daphne.service.stop()


def wait_for_model(server: Daphne, timeout: float = 240) -> None:
    """Block until the server's /health says ready (the model and engine are up)."""

    def ready() -> bool:
        assert server.service.alive(), server.service.log_text()
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    wait_until(ready, timeout, "the model to load", interval=0.25)


@contextmanager
def serving(name: str, log_dir: Path, timeout: float = 240, **env: str) -> Iterator[Daphne]:
    """A Daphne started with `env`, once its model is ready; stopped by pid afterwards."""
    server = start_daphne(name, log_dir, **env)
    try:
        wait_for_model(server, timeout)
        yield server
    finally:
        server.service.stop()


@pytest.fixture(scope="session")
def daphne(django_db_setup, service_logs) -> Iterator[Daphne]:
    """The real ASGI server, loading the real model in the background."""
    server = start_daphne("daphne", service_logs)
    try:
        yield server
    finally:
        server.service.stop()


@pytest.fixture(scope="session")
def engine_server(daphne) -> Daphne:
    """The shared Daphne once its model and engine are ready to serve."""
    wait_for_model(daphne)
    return daphne


@pytest.fixture
def celery_worker(django_db_setup, service_logs) -> Iterator[Service]:
    """A real Celery worker process consuming the media queue from the test Redis."""
    from tests.support.media import start_worker

    worker = start_worker(service_logs)
    try:
        yield worker.service
    finally:
        worker.service.stop()


@pytest.fixture(scope="module")
def chromium():
    """Debian's Chromium driven by Playwright; never a downloaded browser.

    Playwright's sync API keeps an event loop running in this thread, which makes Django
    refuse ORM calls from the test body; for the browser modules alone that guard is lifted.
    """
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium):
    """A fresh browser context and page per test."""
    context = chromium.new_context()
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()
