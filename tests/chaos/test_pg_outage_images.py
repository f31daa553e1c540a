"""PostgreSQL stops for 30 s while four images render; each ends with an outcome, and a socket
opened during the outage is closed cleanly and resumes after.

The scenario runs its own PostgreSQL cluster (the `private_postgres` fixture) and points a
Daphne and a worker with beat at it. Four turns ask for an image (renders of about 15 s, one
pool process each); once all four are drawing, the cluster gets a fast shutdown. A render
that finds the database gone can record nothing, not even a failure, so it asks again every
second without spending its retries (`media/rendering.py`) and draws again once the database
answers. During the outage a socket of the chat (a plain client, and the page in Chromium,
whose socket is made to reconnect) is closed with 4503 and no traceback
(`chat/socket_auth.py`); the page says so and resumes by itself after the restart.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import websockets
from django.db import connections
from django.utils import timezone
from playwright.sync_api import WebSocketRoute, expect

from chat.models import Part
from tests.chaos import conftest as chaos
from tests.conftest import start_daphne, wait_for_model
from tests.support.media import start_worker
from tests.support.processes import wait_until

pytestmark = chaos.BROWSER_SCENARIO

OUTAGE = 30.0  # seconds without PostgreSQL
IMAGES = 4  # images rendering when it stops
RENDER = {"TANDEM_IMAGE_STEPS": "30", "TANDEM_IMAGE_STEP_DELAY": "0.5"}  # about 15 s each
RECOVERY_BOUND = 90.0  # seconds from PostgreSQL being back until every image must be final
SOCKET_BOUND = 15.0  # seconds after the restart for a socket to get its snapshot again
DATABASE_UNAVAILABLE = 4503
PROMPT = "A lighthouse on a cliff in a storm"


async def socket_outcome(url: str, headers: dict[str, str]) -> tuple[str, int | None, float]:
    """Open the chat's socket once: ("snapshot", None, s) or ("closed", code, s)."""
    started = time.monotonic()
    try:
        async with websockets.connect(url, additional_headers=headers, open_timeout=20) as ws:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=20))
            return frame["type"], None, time.monotonic() - started
    except websockets.ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd else None
        return "closed", code, time.monotonic() - started
    except websockets.InvalidStatus as refused:
        return f"refused {refused.response.status_code}", None, time.monotonic() - started


def open_socket(url: str, headers: dict[str, str]) -> tuple[str, int | None, float]:
    """`socket_outcome` on a thread of its own (Playwright's loop runs on this one)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, socket_outcome(url, headers)).result()


def test_postgres_stopped_30_s_while_images_render(
    service_logs, private_postgres, private_redis, page, tmp_path
):
    env = chaos.outage_env(private_redis, tmp_path)
    tokens = {"TANDEM_CHAT_MAX_NEW_TOKENS": "48", "TANDEM_CHAT_TEMPERATURE": "0"}
    server = start_daphne("daphne-pg-images", service_logs, **tokens, **env, **chaos.SERVER_ENV)
    worker = start_worker(
        service_logs, concurrency=IMAGES, beat_schedule=tmp_path / "beat", **env, **RENDER
    )
    sockets: list[WebSocketRoute] = []
    closes_to_page: list[int | None] = []

    def through(route: WebSocketRoute) -> None:
        """The page's socket, passed to the server as is; the server's close codes noted."""
        upstream = route.connect_to_server()

        def closed(code: int | None, reason: str | None) -> None:
            closes_to_page.append(code)
            route.close(code=code, reason=reason or "")

        upstream.on_close(closed)
        sockets.append(route)

    try:
        wait_for_model(server)
        visitors = [chaos.make_visitor("pg-images") for _ in range(IMAGES)]
        conversations = [visitor.conversation() for visitor in visitors]
        replies = []
        for visitor, conversation in zip(visitors, conversations, strict=True):
            status, _, body = visitor.post_turn(server, conversation, PROMPT, image=True)
            assert status == 201, body
            replies.append(body["reply"])
        text_ids = [reply["parts"][0]["id"] for reply in replies]
        image_ids = [reply["parts"][1]["id"] for reply in replies]
        page.route_web_socket(re.compile(r"/ws/conversations/"), through)
        page.context.add_cookies(visitors[0].browser_cookies(server))
        page.goto(f"{server.url}/c/{conversations[0].pk}/")
        connection = page.locator("#connection")
        expect(connection).to_have_attribute("data-connection", "open")
        ws_url = f"{server.ws_url}/ws/conversations/{conversations[0].pk}/"
        ws_headers = {"Cookie": visitors[0].cookie_header, "Origin": server.url}

        def all_drawing() -> bool:
            drawing = Part.objects.filter(pk__in=image_ids, state=Part.State.RUNNING)
            return drawing.filter(progress__gt=0).count() == IMAGES

        chaos.wait_terminal(text_ids, 120, "the texts to end")
        wait_until(all_drawing, 60, "all four images to be drawing", interval=0.2)
        texts_before = dict(Part.objects.filter(pk__in=text_ids).values_list("pk", "text"))
        progress_at_stop = list(
            Part.objects.filter(pk__in=image_ids).values_list("progress", flat=True)
        )
        connections["default"].close()  # this process's own connection dies with the server
        private_postgres.stop()
        stopped, stopped_at = time.monotonic(), timezone.now()

        # During the outage: a plain client opens the socket, then the page's socket drops and
        # the page reconnects by itself.
        outcomes = [open_socket(ws_url, ws_headers)]
        sockets[-1].close(code=4000, reason="dropped by the chaos scenario")
        expect(connection).to_contain_text("database is unavailable", timeout=15_000)
        page_words = connection.text_content()
        # Waiting through Playwright lets its routing (the page's reconnects) run meanwhile.
        while time.monotonic() - stopped < OUTAGE - 3:
            outcomes.append(open_socket(ws_url, ws_headers))
            page.wait_for_timeout(2000)
        page.wait_for_timeout(max(0.0, OUTAGE - (time.monotonic() - stopped)) * 1000)
        outage = time.monotonic() - stopped
        private_postgres.start()
        back, back_at = time.monotonic(), timezone.now()

        after = ("closed", DATABASE_UNAVAILABLE, 0.0)
        while after[0] != "snapshot" and time.monotonic() - back < SOCKET_BOUND:
            after = open_socket(ws_url, ws_headers)
            time.sleep(0.2 if after[0] != "snapshot" else 0)
        socket_back = time.monotonic() - back
        expect(connection).to_have_attribute("data-connection", "open", timeout=30_000)
        page_back = time.monotonic() - back  # its backoff had grown to 10 s during the outage
        chaos.wait_terminal(image_ids, RECOVERY_BOUND, "every image to end after the restart")
        images_final = time.monotonic() - back
        shown_state = page.locator(f'[data-part-id="{image_ids[0]}"]')
        expect(shown_state).to_have_attribute("data-state", "succeeded", timeout=30_000)
        assert server.service.alive() and worker.service.alive()
    finally:
        server.service.stop()
        worker.service.stop()
    web_log = server.service.log_path.read_text(errors="replace")
    worker_log = worker.service.log_path.read_text(errors="replace")

    images = list(Part.objects.filter(pk__in=image_ids).order_by("pk"))
    texts = list(Part.objects.filter(pk__in=text_ids).order_by("pk"))
    final_after = [chaos.seconds_between(back_at, part.finished_at) for part in images]
    codes = [code for _, code, _ in outcomes]
    waits = worker_log.count("the database is unavailable; trying again")
    web_tracebacks = web_log.count("Traceback")
    worker_tracebacks = worker_log.count("Traceback")
    states = {part.pk: part.state for part in images}
    page_refusals = closes_to_page.count(DATABASE_UNAVAILABLE)
    figures = chaos.record_figures(
        "pg_outage_images",
        f"PostgreSQL down {outage:.0f} s while {IMAGES} images rendered: "
        f"{sum(s == Part.State.SUCCEEDED for s in states.values())} succeeded, "
        f"{sum(s == Part.State.FAILED for s in states.values())} failed, 0 stuck; the last "
        f"final {max(final_after):.1f} s after the restart ({waits} database waits); "
        f"{codes.count(DATABASE_UNAVAILABLE)}/{len(codes)} sockets during it closed 4503 in at "
        f"most {max(s for _, _, s in outcomes):.2f} s, the page got 4503 {page_refusals} "
        f'times and said "{page_words}"; a socket '
        f"had its snapshot {socket_back:.1f} s after the restart, the page was live again "
        f"after {page_back:.1f} s; tracebacks: web {web_tracebacks}, worker {worker_tracebacks}",
        outage_seconds=round(outage, 1),
        image_progress_at_stop=[round(p, 2) for p in progress_at_stop],
        images={
            part.pk: {
                "state": part.state,
                "error": part.error,
                "final_after_restart_s": round(seconds, 2),
                "attempt": part.attempt,
            }
            for part, seconds in zip(images, final_after, strict=True)
        },
        seconds_until_every_image_final_after_restart=round(images_final, 2),
        database_waits_in_worker_log=waits,
        texts={part.pk: {"state": part.state, "characters": len(part.text)} for part in texts},
        sockets_during_outage=[
            {"outcome": what, "code": code, "seconds": round(s, 3)} for what, code, s in outcomes
        ],
        page_status_during_outage=page_words,
        close_codes_the_page_got=closes_to_page,
        socket_snapshot_after_restart_s=round(socket_back, 2),
        page_live_again_after_restart_s=round(page_back, 2),
        web_log_refusals=web_log.count("database unavailable"),
        tracebacks={"web": web_tracebacks, "worker": worker_tracebacks},
        stopped_at=stopped_at.isoformat(),
    )
    unfinished = [p.pk for p in images if p.state not in chaos.FINAL]
    assert unfinished == [], figures
    assert all(
        p.state == Part.State.SUCCEEDED or (p.state == Part.State.FAILED and p.error)
        for p in images
    ), figures
    assert max(final_after) <= RECOVERY_BOUND
    assert all(p.state == Part.State.SUCCEEDED for p in texts), figures
    assert {p.pk: p.text for p in texts} == texts_before  # the outage left the texts alone
    assert codes and set(codes) == {DATABASE_UNAVAILABLE}, figures
    assert page_refusals >= 2  # it kept trying, with its backoff
    assert "database is unavailable" in page_words
    assert after[0] == "snapshot" and socket_back <= SOCKET_BOUND, figures
    assert web_tracebacks == 0 and worker_tracebacks == 0, figures
