"""Redis stops for 30 s while 20 turns come in; nothing is lost and everything ends.

Redis carries the channel layer (live events), the live text tail, the heartbeats and the
Celery broker, and this one keeps nothing on disk: stopping it loses every queued task as a
crash would. Half the turns are sent before the stop (their replies are streaming when it
goes), half during the outage. Text keeps streaming into the database; images that could not
be queued, or whose queue was lost, are sent again by beat's sweeper once Redis is back.
A browser watching one conversation says the connection was lost, reconnects by itself and
shows the final reply.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from chat.models import Message, Part
from media.models import SweeperAction
from tests.chaos.conftest import (
    FINAL,
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

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.model,
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

OUTAGE = 30.0  # seconds without Redis
TURNS, BEFORE = 20, 10  # turns in all, and how many are sent before Redis stops
SPACING = 1.5  # seconds between the turns sent during the outage
RECOVERY_BOUND = 90.0  # seconds from Redis being back until every part is final
PROMPT = "Write four short sentences about the sea."
FINAL_STATE = re.compile("^(succeeded|failed|cancelled|interrupted)$")


def test_redis_stopped_30_s_during_20_turns_loses_nothing(
    service_logs, private_redis, page, tmp_path
):
    env = {
        "REDIS_URL": private_redis.url,
        "MEDIA_ROOT": str(tmp_path / "media"),
        "TANDEM_IMAGE_STEPS": "6",
        "TANDEM_IMAGE_STEP_DELAY": "0.1",
        "TANDEM_SWEEP_INTERVAL": "1",
        "TANDEM_QUEUED_STALE_AFTER": "3",
    }
    with ThreadPoolExecutor(2) as starter:
        web = starter.submit(
            start_daphne,
            "daphne-outage",
            service_logs,
            TANDEM_CHAT_MAX_NEW_TOKENS="48",
            **env,
            **SERVER_ENV,
        )
        work = starter.submit(start_worker, service_logs, beat_schedule=tmp_path / "beat", **env)
        server, worker = web.result(), work.result()
    try:
        wait_for_model(server)
        visitors = [make_visitor("outage") for _ in range(TURNS)]
        conversations = [visitor.conversation() for visitor in visitors]
        page.context.add_cookies(visitors[0].browser_cookies(server))
        page.goto(f"{server.url}/c/{conversations[0].pk}/")
        chat = Chat(page, server.url, visitors[0].user, conversations[0].pk)
        connection = page.locator("#connection")
        expect(connection).to_have_attribute("data-connection", "open")

        answers: dict[int, tuple] = {}

        def send(number: int) -> None:
            visitor, conversation = visitors[number], conversations[number]
            answers[number] = visitor.post_turn(server, conversation, PROMPT, number % 2 == 0)

        for number in range(BEFORE):
            send(number)
        wait_until(
            lambda: Part.objects.filter(state=Part.State.STREAMING, seq__gt=0).exists(),
            60,
            "a reply to be streaming",
        )
        in_flight = Part.objects.exclude(state__in=FINAL).count()
        private_redis.stop()
        stopped = time.monotonic()
        expect(connection).not_to_have_attribute("data-connection", "open", timeout=15_000)
        lost_connection_words = connection.text_content()
        for number in range(BEFORE, TURNS):
            send(number)
            time.sleep(SPACING)
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped)))
        outage = time.monotonic() - stopped
        private_redis.start()
        back, back_at = time.monotonic(), timezone.now()

        accepted = {n: body for n, (status, _, body) in answers.items() if status == 201}
        parts = [part["id"] for body in accepted.values() for part in body["reply"]["parts"]]
        first_text = accepted[0]["reply"]["parts"][0]["id"]
        shown = page.locator(f'[data-part-id="{first_text}"]')
        expect(connection).to_have_attribute("data-connection", "open", timeout=60_000)
        expect(shown).to_have_attribute("data-state", FINAL_STATE, timeout=60_000)
        reconnected = time.monotonic() - back
        wait_terminal(parts, RECOVERY_BOUND, "every part to end after Redis is back")
        recovery = time.monotonic() - back
        expect(shown).to_have_attribute("data-state", Part.objects.get(pk=first_text).state)
        shown_text = chat.raw_text(first_text)
        assert server.service.alive() and worker.service.alive()
    finally:
        server.service.stop()
        worker.service.stop()

    final = {part.pk: part for part in Part.objects.filter(pk__in=parts)}
    texts = [part for part in final.values() if part.kind == Part.Kind.TEXT]
    images = [part for part in final.values() if part.kind == Part.Kind.IMAGE]
    lost = [
        n
        for n, body in accepted.items()
        if not Message.objects.filter(pk=body["reply"]["id"]).exists()
        or not Message.objects.filter(pk=body["user"]["id"], text=PROMPT).exists()
    ]
    text_lost = [p.pk for p in texts if p.completion_tokens and not p.text]
    unexplained = [p.pk for p in final.values() if p.state != Part.State.SUCCEEDED and not p.error]
    statuses = Counter(status for status, _, _ in answers.values())
    # Seconds after Redis came back when the last part of each kind ended (negative: before).
    last_final = {
        kind: round(max(seconds_between(back_at, p.finished_at) for p in kind_parts), 2)
        for kind, kind_parts in (("text", texts), ("image", images))
    }
    figures = record_figures(
        "redis_outage",
        f"Redis down {outage:.0f} s during {TURNS} turns: {len(accepted)} accepted, "
        f"{len(lost)} lost; text {dict(Counter(p.state for p in texts))}, images "
        f"{dict(Counter(p.state for p in images))}; all final {recovery:.1f} s after Redis "
        f"returned (last text {last_final['text']} s, last image {last_final['image']} s); "
        f"the page said {lost_connection_words!r} and showed the reply "
        f"{reconnected:.1f} s after",
        outage_seconds=round(outage, 1),
        turns_sent=TURNS,
        turns_sent_during_outage=TURNS - BEFORE,
        parts_in_flight_when_redis_stopped=in_flight,
        statuses={str(status): count for status, count in sorted(statuses.items())},
        turns_accepted=len(accepted),
        turns_lost=len(lost),
        text_parts_by_state=dict(Counter(p.state for p in texts)),
        text_parts_with_text_lost=len(text_lost),
        image_parts_by_state=dict(Counter(p.state for p in images)),
        images_sent_again_by_sweeper=SweeperAction.objects.filter(
            part_id__in=parts, action=SweeperAction.Action.REQUEUED
        ).count(),
        parts_ended_without_a_reason=len(unexplained),
        seconds_until_all_final_after_redis_back=round(recovery, 2),
        last_final_after_redis_back_by_kind=last_final,
        bound_seconds_until_all_final=RECOVERY_BOUND,
        page_said_during_outage=lost_connection_words,
        seconds_until_page_showed_final_reply=round(reconnected, 2),
    )
    assert statuses == {201: TURNS}, statuses
    assert lost == [] and text_lost == [] and unexplained == []
    assert all(p.state in FINAL for p in final.values())
    assert all(p.text for p in texts if p.state != Part.State.FAILED)
    assert figures["seconds_until_all_final_after_redis_back"] <= RECOVERY_BOUND
    assert shown_text == final[first_text].text
