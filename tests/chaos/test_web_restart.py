"""The web process dies mid-stream (SIGKILL) and comes back on the same port.

Its streaming text parts must end `interrupted` keeping the text the reader had already seen
(beat's sweeper notices the missing heartbeat); the page that was open reconnects by itself
and says so, and after a reload no conversation shows a spinner, caret or stop button.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

from django.utils import timezone
from playwright.sync_api import expect

from chat.models import Part
from media.sweeper import TEXT_ORPHANED
from tests.chaos.conftest import (
    BROWSER_SCENARIO,
    SERVER_ENV,
    make_visitor,
    record_figures,
    seconds_between,
    wait_terminal,
)
from tests.chat_ui.conftest import Chat
from tests.conftest import start_daphne, wait_for_model
from tests.support.media import start_worker
from tests.support.processes import wait_until

pytestmark = BROWSER_SCENARIO

STREAMS = 3
INTERRUPT_BOUND = 30.0  # seconds from the kill until every streaming part is interrupted
PROMPT = "Write a long story about a lighthouse keeper and his cat."
# Anything on the page that says "still working": a caret, a live part, a stop button.
LIVE_MARKS = """() => ({
  carets: document.querySelectorAll("#messages .caret").length,
  live_parts: document.querySelectorAll(
    '#messages .part[data-state="streaming"], #messages .part[data-state="queued"],'
    + ' #messages .part[data-state="running"]').length,
  stop_buttons: document.querySelectorAll("#messages button.stop").length,
  in_progress: document.querySelectorAll('#messages [data-status="in_progress"]').length,
})"""


def live_marks_after_reload(page, url: str) -> dict[str, int]:
    page.goto(url)
    expect(page.locator("#connection")).to_have_attribute("data-connection", "open")
    expect(page.locator("#messages .message-assistant")).to_have_count(1)
    return page.evaluate(LIVE_MARKS)


def test_a_web_process_killed_mid_stream_leaves_interrupted_text_and_no_spinners(
    service_logs, private_redis, page, tmp_path
):
    env = {
        "REDIS_URL": private_redis.url,
        "TANDEM_HEARTBEAT_TTL": "5",
        "TANDEM_SWEEP_INTERVAL": "1",
        "TANDEM_CHAT_MAX_NEW_TOKENS": "400",
        **SERVER_ENV,
    }
    with ThreadPoolExecutor(2) as starter:
        web = starter.submit(start_daphne, "daphne-doomed", service_logs, **env)
        work = starter.submit(start_worker, service_logs, beat_schedule=tmp_path / "beat", **env)
        server, worker = web.result(), work.result()
    restarted = None
    try:
        wait_for_model(server)
        visitors = [make_visitor("restart") for _ in range(STREAMS)]
        conversations = [visitor.conversation() for visitor in visitors]
        page.context.add_cookies(visitors[0].browser_cookies(server))
        page.goto(f"{server.url}/c/{conversations[0].pk}/")
        chat = Chat(page, server.url, visitors[0].user)
        connection = page.locator("#connection")
        expect(connection).to_have_attribute("data-connection", "open")

        parts = []
        for visitor, conversation in zip(visitors, conversations, strict=True):
            status, _, body = visitor.post_turn(server, conversation, PROMPT)
            assert status == 201, body
            parts.append(body["reply"]["parts"][0]["id"])
        chat.wait_text(40)
        wait_until(
            lambda: (
                Part.objects.filter(pk__in=parts, state="streaming", seq__gt=0).count() == STREAMS
            ),
            60,
            "every reply to be streaming",
        )
        seen = chat.raw_text(parts[0])
        server.service.kill(signal.SIGKILL)
        killed_at, killed = timezone.now(), time.monotonic()
        expect(connection).not_to_have_attribute("data-connection", "open", timeout=10_000)
        page_said = connection.text_content()

        restarted = start_daphne("daphne-restarted", service_logs, port=server.port, **env)
        wait_terminal(parts, INTERRUPT_BOUND, "the orphaned replies to be interrupted")
        # The page that stayed open reconnects to the new process and shows the outcome.
        shown = page.locator(f'[data-part-id="{parts[0]}"]')
        expect(connection).to_have_attribute("data-connection", "open", timeout=30_000)
        expect(shown).to_have_attribute("data-state", "interrupted", timeout=15_000)
        expect(shown.locator(".part-status")).to_have_text("interrupted — the server restarted")
        page_showed = time.monotonic() - killed
        shown_text = chat.raw_text(parts[0])

        marks = [live_marks_after_reload(page, f"{server.url}/c/{conversations[0].pk}/")]
        for visitor, conversation in zip(visitors[1:], conversations[1:], strict=True):
            context = page.context.browser.new_context()
            try:
                context.add_cookies(visitor.browser_cookies(server))
                other = context.new_page()
                marks.append(live_marks_after_reload(other, f"{server.url}/c/{conversation.pk}/"))
            finally:
                context.close()
        assert restarted.service.alive(), restarted.service.log_text()
    finally:
        for service in (server.service, worker.service, restarted and restarted.service):
            if service is not None:
                service.stop()

    final = list(Part.objects.filter(pk__in=parts).order_by("pk"))
    to_interrupted = [seconds_between(killed_at, part.finished_at) for part in final]
    kept = [part for part in final if part.state == Part.State.INTERRUPTED and part.text]
    spinners = sum(sum(mark.values()) for mark in marks)
    figures = record_figures(
        "web_restart",
        f"web process SIGKILLed with {STREAMS} replies streaming: {len(kept)} interrupted "
        f"with their text kept ({[len(p.text) for p in final]} characters), max "
        f"{max(to_interrupted):.1f} s kill to interrupted; the open page said {page_said!r} "
        f"and showed 'interrupted' after {page_showed:.1f} s; live marks after reload: "
        f"{spinners}",
        streams_killed=STREAMS,
        parts_by_state={
            state: sum(p.state == state for p in final) for state in {p.state for p in final}
        },
        interrupted_with_text_kept=len(kept),
        characters_kept=[len(part.text) for part in final],
        characters_the_page_had_shown=len(seen),
        max_seconds_kill_to_interrupted=round(max(to_interrupted), 2),
        bound_seconds_kill_to_interrupted=INTERRUPT_BOUND,
        page_said_after_the_kill=page_said,
        seconds_until_open_page_showed_interrupted=round(page_showed, 2),
        live_marks_after_reload=marks,
        spinners_after_reload=spinners,
    )
    assert len(kept) == STREAMS, [(p.state, p.text) for p in final]
    assert all(part.error == TEXT_ORPHANED for part in final)
    assert final[0].text.startswith(seen) and shown_text == final[0].text
    assert figures["max_seconds_kill_to_interrupted"] <= INTERRUPT_BOUND
    assert spinners == 0, marks
