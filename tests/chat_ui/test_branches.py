"""Editing a sent message in the browser: refused while a reply is being written, then a new
branch drawn in place of the old one (its reply laid out again: text and image), the old branch
a click away, and the branch shown kept across a reload."""

import pytest
from playwright.sync_api import expect

from chat.models import Message, Part
from tests.chat_ui.conftest import REPLY_TIMEOUT, shot

pytestmark = [pytest.mark.browser, pytest.mark.model, pytest.mark.django_db(transaction=True)]


def set_max_tokens(page, tokens: int) -> None:
    page.click("#settings-panel summary")
    page.fill("#setting-max_new_tokens", str(tokens))
    page.click("#settings-form button[type=submit]")
    page.click("#settings-panel summary")


def part_kinds(chat) -> list[str]:
    return chat.reply.locator(".part").evaluate_all("nodes => nodes.map(n => n.dataset.kind)")


def test_edit_a_sent_message_and_browse_its_branches(chat, celery_worker):
    page = chat.page
    set_max_tokens(page, 1000)  # long enough to still be writing when the edit is tried
    chat.send("Tell me a long story about a lighthouse.", image=True)
    chat.wait_text(1)
    asked = page.locator(".message-user").first
    asked.locator("button.edit-message").click()
    box = asked.locator(".edit-text")
    expect(box).to_have_value("Tell me a long story about a lighthouse.")
    expect(box).to_be_focused()
    box.fill("Draw a lighthouse. Answer in one word.")
    box.press("Enter")
    expect(asked.locator(".edit-error")).to_contain_text("still being made")
    assert Message.objects.filter(role="user").count() == 1  # refused: nothing written
    box.press("Escape")
    expect(asked.locator(".edit-form")).to_have_count(0)
    expect(asked.locator(".bubble")).to_be_visible()
    chat.reply.locator("button.stop").click()
    assert chat.wait_final(chat.text_part) == "cancelled"
    old_text_id = chat.part_id(chat.text_part)
    chat.wait_final(chat.image_part)  # drawn or stopped: nothing of the branch is left running

    page.click("#settings-panel summary")
    page.fill("#setting-max_new_tokens", "8")
    page.click("#settings-form button[type=submit]")
    expect(page.locator("#settings-notice")).to_contain_text("Saved")
    page.click("#settings-panel summary")
    asked.locator("button.edit-message").click()
    asked.locator(".edit-text").fill("Draw a lighthouse. Answer in one word.")
    asked.locator(".edit-form button[type=submit]").click()

    asked = page.locator(".message-user").first
    expect(asked.locator(".branch-label")).to_have_text("2 / 2")
    expect(asked.locator(".bubble")).to_have_text("Draw a lighthouse. Answer in one word.")
    expect(page.locator(".message-assistant")).to_have_count(1)
    assert chat.part_id(chat.text_part) != old_text_id
    assert part_kinds(chat) == ["text", "image"]  # laid out again, as the turn asked
    assert chat.wait_final(chat.text_part) == "succeeded"
    expect(chat.image_part.locator("figure img")).to_be_visible(timeout=REPLY_TIMEOUT)
    new_text_id = chat.part_id(chat.text_part)
    shot(page, "message-branches")

    asked.locator("button.branch-step[aria-label='Previous branch']").click()
    asked = page.locator(".message-user").first
    expect(asked.locator(".branch-label")).to_have_text("1 / 2")
    expect(asked.locator(".bubble")).to_have_text("Tell me a long story about a lighthouse.")
    expect(chat.text_part).to_have_attribute("data-part-id", str(old_text_id))
    assert chat.raw_text(old_text_id) == Part.objects.get(pk=old_text_id).text
    expect(asked.locator("button.branch-step[aria-label='Previous branch']")).to_be_disabled()

    page.reload()  # the branch shown is saved
    asked = page.locator(".message-user").first
    expect(asked.locator(".branch-label")).to_have_text("1 / 2")
    asked.locator("button.branch-step[aria-label='Next branch']").click()
    expect(page.locator(".message-user").first.locator(".branch-label")).to_have_text("2 / 2")
    expect(chat.text_part).to_have_attribute("data-part-id", str(new_text_id))
    expect(chat.image_part.locator("figure img")).to_be_visible()
