"""The composer: Enter and Shift+Enter, and refusals shown next to it, never as alerts."""

import pytest
from playwright.sync_api import expect

from chat.models import Conversation
from tests.chat_ui.conftest import shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def fail_on_dialog(page):
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    return dialogs


def test_too_long_input_is_explained_next_to_the_composer(chat):
    dialogs = fail_on_dialog(chat.page)
    textarea = chat.page.locator("#composer textarea")
    notice = chat.page.locator("#composer #composer-notice")

    textarea.press("Enter")  # nothing written: nothing sent
    expect(notice).to_have_text("Write a message first.")

    textarea.fill("first line")
    textarea.press("Shift+Enter")
    textarea.type("second line")
    expect(textarea).to_have_value("first line\nsecond line")
    expect(notice).to_be_hidden()  # typing clears the old notice

    too_long = "x" * 8001
    chat.send(too_long, drawn=False)
    expect(notice).to_be_visible()
    expect(notice).to_have_attribute("data-kind", "error")
    expect(notice).to_contain_text("8,001 characters; the limit is 8,000")
    expect(textarea).to_have_value(too_long)  # kept, so it can be shortened
    expect(textarea).to_have_attribute("aria-invalid", "true")
    shot(chat.page, "composer-too-long")
    assert chat.page.locator(".message").count() == 0
    assert not Conversation.objects.filter(owner=chat.user).exists()  # refused: no empty row
    assert dialogs == []


@pytest.mark.model
def test_too_many_replies_in_progress_is_a_busy_notice(chat):
    notice = chat.page.locator("#composer-notice")
    for n in range(3):
        chat.send(f"Write a long story about dragon number {n + 1}.")
    chat.send("One more, please.", drawn=False)
    expect(notice).to_have_attribute("data-kind", "busy")
    expect(notice).to_contain_text("3 replies in progress")
    expect(chat.page.locator("button.send")).to_be_disabled()  # until Retry-After has passed
    expect(chat.page.locator(".message-assistant")).to_have_count(3)
    shot(chat.page, "composer-busy")
    ids = [
        m.get_attribute("data-message-id") for m in chat.page.locator(".message-assistant").all()
    ]
    for message_id in ids:
        stop = chat.page.locator(f'[data-message-id="{message_id}"] button.stop')
        if stop.count():
            stop.click()
    expect(chat.page.locator(".message-assistant[data-status=in_progress]")).to_have_count(
        0, timeout=30_000
    )
    expect(chat.page.locator("button.send")).to_be_enabled(timeout=10_000)
