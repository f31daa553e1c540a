"""The conversation's settings panel: errors next to their field, saved values kept, and a new
conversation's settings sent with its first message."""

import pytest
from playwright.sync_api import expect

from chat.models import Conversation, Part
from tests.chat_ui.conftest import make_user, shot
from tests.chat_ui.test_conversations import open_page, saved_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_panel_explains_bad_values_and_saves_good_ones(daphne, page):
    user, password = make_user("settings")
    conversation = saved_conversation(user, "Tuning")
    open_page(page, daphne, user, password, conversation)
    expect(page.locator("#composer input[name=image]")).not_to_be_checked()
    page.click("#settings-panel summary")
    form = page.locator("#settings-form")
    expect(form.locator("#setting-temperature")).to_have_value("0.3")

    form.locator("#setting-temperature").fill("5")
    form.locator("#setting-max_new_tokens").fill("0")
    form.locator("button[type=submit]").click()
    expect(form.locator('.field-error[data-for="temperature"]')).to_have_text(
        "Temperature must be between 0 and 2."
    )
    expect(form.locator('.field-error[data-for="max_new_tokens"]')).to_have_text(
        "Max new tokens must be between 1 and 1024."
    )
    expect(form.locator("#setting-temperature")).to_have_attribute("aria-invalid", "true")
    shot(page, "conversation-settings-errors")
    assert Conversation.objects.get(pk=conversation.pk).temperature is None  # the default still

    form.locator("#setting-system_prompt").fill("Answer in one sentence.")
    form.locator("#setting-temperature").fill("0")
    form.locator("#setting-max_new_tokens").fill("64")
    form.locator("input[name=image_by_default]").check()
    form.locator("button[type=submit]").click()
    expect(page.locator("#settings-notice")).to_have_text("Saved: the next reply uses them.")
    expect(form.locator(".field-error:visible")).to_have_count(0)
    expect(page.locator("#composer input[name=image]")).to_be_checked()
    saved = Conversation.objects.get(pk=conversation.pk)
    assert (saved.system_prompt, saved.temperature, saved.max_new_tokens) == (
        "Answer in one sentence.",
        0.0,
        64,
    )
    assert saved.image_by_default

    page.reload()
    page.click("#settings-panel summary")
    expect(page.locator("#setting-system_prompt")).to_have_value("Answer in one sentence.")
    expect(page.locator("#setting-max_new_tokens")).to_have_value("64")
    expect(page.locator("#composer input[name=image]")).to_be_checked()


@pytest.mark.model
def test_a_new_conversations_settings_go_with_its_first_message(chat):
    page = chat.page
    page.click("#settings-panel summary")
    page.fill("#setting-system_prompt", "You are a terse assistant.")
    page.fill("#setting-max_new_tokens", "4")
    page.click("#settings-form button[type=submit]")
    expect(page.locator("#settings-notice")).to_have_text(
        "Kept: they apply from the first message."
    )
    assert not Conversation.objects.filter(owner=chat.user).exists()
    shot(page, "conversation-settings")
    chat.send("Tell me a long story about a lighthouse.")
    assert chat.wait_final(chat.text_part) == "succeeded"
    conversation = Conversation.objects.get(owner=chat.user)
    assert conversation.system_prompt == "You are a terse assistant."
    assert conversation.max_new_tokens == 4
    part = Part.objects.get(pk=chat.part_id(chat.text_part))
    assert part.completion_tokens == 4 and part.finish_reason == "length"
