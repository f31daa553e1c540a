"""Regenerate in the browser: a new version drawn in place, the old one a click away."""

import pytest
from playwright.sync_api import expect

from chat.models import Message, Part
from tests.chat_ui.conftest import shot

pytestmark = [pytest.mark.browser, pytest.mark.model, pytest.mark.django_db(transaction=True)]


def test_regenerate_and_browse_the_versions(chat):
    page = chat.page
    page.click("#settings-panel summary")  # short replies: the test waits for three of them
    page.fill("#setting-max_new_tokens", "6")
    page.fill("#setting-temperature", "1.2")
    page.click("#settings-form button[type=submit]")
    page.click("#settings-panel summary")
    chat.send("Name an animal.")
    assert chat.wait_final(chat.text_part) == "succeeded"
    first_id = chat.part_id(chat.text_part)
    head = chat.reply.locator(".message-head")
    expect(head.locator(".versions")).to_have_count(0)  # one version: no navigation

    head.locator("button.regenerate").click()
    expect(head.locator(".version-label")).to_have_text("2 / 2")
    assert chat.part_id(chat.text_part) != first_id
    assert chat.wait_final(chat.text_part) == "succeeded"
    second = chat.raw_text(chat.part_id(chat.text_part))
    shot(page, "reply-versions")

    head.locator("button.version-step[aria-label='Previous version']").click()
    expect(head.locator(".version-label")).to_have_text("1 / 2")
    expect(chat.text_part).to_have_attribute("data-part-id", str(first_id))
    first = Part.objects.get(pk=first_id).text
    assert chat.raw_text(first_id) == first
    expect(head.locator("button.version-step[aria-label='Previous version']")).to_be_disabled()
    reply = Message.objects.get(pk=int(chat.reply.get_attribute("data-message-id")))
    assert reply.shown_version == 1  # and so the model's history, for the next turn

    page.reload()  # the version shown is saved
    head = chat.reply.locator(".message-head")
    expect(head.locator(".version-label")).to_have_text("1 / 2")
    head.locator("button.version-step[aria-label='Next version']").click()
    expect(head.locator(".version-label")).to_have_text("2 / 2")
    assert chat.raw_text(chat.part_id(chat.text_part)) == second
