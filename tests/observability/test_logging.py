"""Structured logs: the ids on every line, the request id at the edge, and one turn followed
from a real Daphne through the engine's writer thread to a real Celery worker."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from logging.config import DictConfigurator

import pytest
import websockets
from django.conf import settings
from django.contrib.auth import get_user_model

from chat.models import Conversation, Part
from config.logging import ContextFilter, bound
from tests.chat.test_sse import signed_in
from tests.conftest import start_daphne, wait_for_model
from tests.media.conftest import IMAGES, finished_runs
from tests.support.media import start_worker
from tests.support.processes import ROOT, child_env, wait_until


def formatted(format_name: str, **extra) -> str:
    """One record through the configured filter and formatter, as the console handler does."""
    formatter = DictConfigurator({}).configure_formatter(
        dict(settings.LOGGING["formatters"][format_name])
    )
    record = logging.getLogger("chat.services").makeRecord(
        "chat.services", logging.INFO, __file__, 1, "part %s moved", (7,), None, extra=extra
    )
    ContextFilter().filter(record)
    return formatter.format(record)


def test_json_lines_carry_the_bound_ids_and_explicit_ids_win():
    with bound(request_id="req-1", message_id=6, part_id=1):
        line = formatted("json", part_id=7, task_id="task-9")
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "part 7 moved"
    assert (entry["level"], entry["logger"]) == ("INFO", "chat.services")
    assert (entry["request_id"], entry["message_id"]) == ("req-1", 6)
    assert (entry["part_id"], entry["task_id"]) == (7, "task-9")  # extra= beats the context
    assert entry["time"].endswith("+00:00") and isinstance(entry["pid"], int)


def test_plain_lines_end_with_the_ids_and_leave_them_out_when_none_are_bound():
    with bound(request_id="req-2", part_id=3):
        line = formatted("plain")
    assert line.endswith("INFO chat.services part 7 moved [request_id=req-2 part_id=3]")
    assert formatted("plain").endswith("part 7 moved")


def log_format(**env: str) -> subprocess.CompletedProcess:
    """Load the settings in a fresh process and print the console handler's formatter."""
    probe = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.LOGGING['handlers']['console']['formatter'])"
    )
    return subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(DJANGO_SETTINGS_MODULE="config.settings", **env),
    )


def test_json_in_production_plain_in_development_and_either_by_setting():
    production = {"DEBUG": "0", "SECRET_KEY": "x" * 50, "ALLOWED_HOSTS": "chat.example.com"}
    assert log_format(**production, TANDEM_LOG_FORMAT="").stdout.strip() == "json"
    assert log_format(DEBUG="1", TANDEM_LOG_FORMAT="").stdout.strip() == "plain"
    assert log_format(DEBUG="1", TANDEM_LOG_FORMAT="json").stdout.strip() == "json"
    wrong = log_format(DEBUG="1", TANDEM_LOG_FORMAT="xml")
    assert wrong.returncode != 0 and "TANDEM_LOG_FORMAT must be json or plain" in wrong.stderr


@pytest.mark.django_db
def test_a_sane_request_id_is_kept_and_echoed_and_the_request_logs_one_line(client, caplog):
    with caplog.at_level(logging.INFO, logger="tandem.request"):
        response = client.get("/health", HTTP_X_REQUEST_ID="lb-7f3a:01")
    assert response["X-Request-ID"] == "lb-7f3a:01"
    [line] = [record for record in caplog.records if record.name == "tandem.request"]
    assert line.getMessage() == f"GET /health {response.status_code}"
    assert line.request_id == "lb-7f3a:01" and line.status == response.status_code


@pytest.mark.parametrize("header", ["two words", "x" * 129, "-leading-dash", "a\u00e9b", ""])
@pytest.mark.django_db
def test_an_unsafe_or_missing_request_id_is_replaced(client, header):
    response = client.get("/health", HTTP_X_REQUEST_ID=header)
    made = response["X-Request-ID"]
    assert made != header and len(made) == 32 and int(made, 16) >= 0


def json_lines(text: str) -> list[dict]:
    """The log lines that are JSON objects, parsed."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def mentioning(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


async def join(url: str, headers: dict[str, str]) -> dict:
    async with websockets.connect(url, additional_headers=headers, open_timeout=30) as ws:
        return json.loads(await asyncio.wait_for(ws.recv(), timeout=30))


@pytest.mark.model
@pytest.mark.django_db(transaction=True)
def test_one_turn_followed_from_the_web_process_to_the_worker(service_logs, media_root):
    """A turn with an image on a real Daphne and a real worker, both logging JSON: every line
    about it shares its request_id, and the ids join the web's lines to the worker's."""
    web = start_daphne(
        "daphne-json-logs",
        service_logs,
        TANDEM_LOG_FORMAT="json",
        MEDIA_ROOT=str(media_root),
        TANDEM_CHAT_MAX_NEW_TOKENS="12",
        TANDEM_CHAT_TEMPERATURE="0",
    )
    worker = start_worker(
        service_logs, TANDEM_LOG_FORMAT="json", MEDIA_ROOT=str(media_root), **IMAGES
    )
    try:
        wait_for_model(web)
        session = signed_in(web, "follower")
        owner = get_user_model().objects.get(username="follower")
        conversation_id = Conversation.objects.create(owner=owner).pk
        socket_id = f"ws-{uuid.uuid4().hex}"
        cookie = f"sessionid={session.cookies['sessionid']}"
        snapshot = asyncio.run(
            join(
                f"{web.ws_url}/ws/conversations/{conversation_id}/",
                {"Cookie": cookie, "Origin": web.url, "X-Request-ID": socket_id},
            )
        )
        assert snapshot["type"] == "snapshot"

        request_id = f"turn-{uuid.uuid4().hex}"
        response = session.post(
            f"{web.url}/c/{conversation_id}/turns",
            json={"text": "Draw a red kite over the sea.", "image": True},
            headers={**csrf(web, session), "X-Request-ID": request_id},
            timeout=60,
        )
        assert response.status_code == 201, response.text
        assert response.headers["X-Request-ID"] == request_id
        reply = response.json()["reply"]
        text_id, image_id = (part["id"] for part in reply["parts"])
        task_id = Part.objects.get(pk=image_id).task_id
        wait_until(lambda: finished_runs(worker, task_id) == 1, 90, "the image task to return")
        wait_until(
            lambda: "streaming -> succeeded" in web.service.log_text(), 120, "the text to end"
        )
        web_text, worker_text = web.service.log_text(), worker.service.log_text()
    finally:
        worker.service.stop()
        web.service.stop()

    # Every line that names the turn's request is one JSON object, in both processes.
    for text in (web_text, worker_text):
        for line in mentioning(text, request_id):
            json.loads(line)
    ours = [entry for entry in json_lines(web_text) if entry.get("request_id") == request_id]
    said = {entry["message"]: entry for entry in ours}
    message_id = reply["id"]
    assert said[f"POST /c/{conversation_id}/turns 201"]["logger"] == "tandem.request"
    assert said[f"turn: reply {message_id} with parts [{text_id}, {image_id}]"]["message_id"] == (
        message_id
    )
    # The text's final move is made on the writer thread, which got the request's context.
    for move in ("queued -> streaming", "streaming -> succeeded"):
        entry = said[f"part {text_id} text: {move}"]
        assert (entry["message_id"], entry["part_id"]) == (message_id, text_id)
    sent = said[f"image part {image_id} sent as task {task_id}"]
    assert (sent["part_id"], sent["task_id"], sent["message_id"]) == (image_id, task_id, message_id)

    in_task = [entry for entry in json_lines(worker_text) if entry.get("task_id") == task_id]
    assert {entry["message"] for entry in in_task} >= {
        f"part {image_id} image: queued -> running",
        f"part {image_id} image: running -> succeeded",
    }
    for entry in in_task:
        assert (entry["request_id"], entry["message_id"], entry["part_id"]) == (
            request_id,
            message_id,
            image_id,
        )
    joined = [entry for entry in json_lines(web_text) if entry.get("request_id") == socket_id]
    assert [entry["message"] for entry in joined] == [
        f"websocket joined conversation {conversation_id}"
    ]


def csrf(server, session) -> dict[str, str]:
    return {"X-CSRFToken": session.cookies["csrftoken"], "Referer": server.url}
