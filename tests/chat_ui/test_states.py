"""Saved states are drawn in words: waiting, interrupted, failed with its reason, stopped,
partial, and the note about older messages left out of the prompt."""

import pytest
from playwright.sync_api import expect

from chat.models import Conversation, Message, Part
from tests.chat_ui.conftest import make_user, shot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def turn(conversation, position, words, parts, **reply_fields):
    Message.objects.create(conversation=conversation, role="user", position=position, text=words)
    reply = Message.objects.create(
        conversation=conversation, role="assistant", position=position + 1, **reply_fields
    )
    for index, (kind, state, fields) in enumerate(parts):
        Part.objects.create(message=reply, index=index, kind=kind, state=state, **fields)
    return reply


def test_saved_states_are_shown_in_words(daphne, page):
    user, password = make_user()
    convo = Conversation.objects.create(owner=user, title="Every state")
    interrupted = turn(
        convo,
        0,
        "Tell me about tides.",
        [
            ("text", "interrupted", {"text": "Tides are caused by", "seq": 4}),
        ],
        history_truncated=True,
    )
    partial = turn(
        convo,
        2,
        "Draw a boat.",
        [
            ("text", "succeeded", {"text": "Here is **a boat**.", "seq": 5}),
            ("image", "failed", {"error": "Failed after 4 tries: the GPU is busy", "attempt": 1}),
        ],
        wants_image=True,
    )
    failed = turn(
        convo,
        4,
        "And a lighthouse?",
        [
            ("text", "failed", {"error": "The engine refused this reply: out of memory"}),
        ],
    )
    stopped = turn(
        convo,
        6,
        "A long story, please.",
        [
            (
                "text",
                "cancelled",
                {"text": "Once upon a time", "seq": 4, "finish_reason": "cancelled"},
            ),
        ],
    )
    waiting = turn(
        convo, 8, "Hello?", [("text", "queued", {}), ("image", "queued", {})], wants_image=True
    )

    page.set_viewport_size({"width": 1280, "height": 1760})
    sign_in(page, daphne.url, user.get_username(), password)
    page.goto(f"{daphne.url}/c/{convo.pk}/")

    def reply(message):
        return page.locator(f'.message-assistant[data-message-id="{message.pk}"]')

    r = reply(interrupted)
    expect(r.locator(".history-note")).to_have_text(
        "Older messages were left out to fit the model's context."
    )
    expect(r.locator(".part-text")).to_have_attribute("data-state", "interrupted")
    expect(r.locator(".part-text .md")).to_have_text("Tides are caused by")
    expect(r.locator(".part-status")).to_have_text("interrupted — the server restarted")
    expect(r.locator(".badge-failed")).to_have_text("interrupted")

    r = reply(partial)
    expect(r).to_have_attribute("data-status", "partial")
    expect(r.locator(".badge-partial")).to_have_text("partial")
    expect(r.locator(".part-text .md strong")).to_have_text("a boat")
    expect(r.locator(".failure-card .failure-reason")).to_have_text(
        "Failed after 4 tries: the GPU is busy"
    )
    expect(r.locator("button.retry-image")).to_be_visible()
    expect(r.locator(".history-note")).to_have_count(0)

    r = reply(failed)
    expect(r.locator(".badge-failed")).to_have_text("failed")
    expect(r.locator(".part-text .part-status")).to_have_text(
        "The text failed: The engine refused this reply: out of memory"
    )

    r = reply(stopped)
    expect(r.locator(".part-status")).to_have_text("stopped")
    expect(r.locator(".badge-stopped")).to_be_visible()
    expect(r.locator(".badge-failed")).to_have_count(0)

    r = reply(waiting)
    expect(r.locator(".part-text .part-status")).to_have_text("waiting…")
    expect(r.locator(".part-text .caret")).to_have_count(0)
    expect(r.locator(".part-image .part-status")).to_have_text("Image waiting for a worker…")
    expect(r.locator("button.stop")).to_be_visible()
    for settled in (interrupted, partial, failed, stopped):
        expect(reply(settled).locator("button.stop")).to_have_count(0)
    # Older replies' states are words on the page, in order, one article per message.
    assert page.locator("#messages .message").count() == 10
    shot(page, "saved-states")
