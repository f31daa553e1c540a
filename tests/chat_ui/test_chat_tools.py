"""Markdown in the page (tables, highlighted code), the copy buttons, and Esc to stop."""

import re

import pytest
from playwright.sync_api import expect

from tests.chat_ui.conftest import make_user, sign_in
from tests.chat_ui.seeded import RICH_REPLY, rich_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def open_rich(daphne, page):
    user, password = make_user()
    convo, reply = rich_conversation(user)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daphne.url)
    sign_in(page, daphne.url, user.get_username(), password)
    page.goto(f"{daphne.url}/c/{convo.pk}/")
    return page.locator(f'[data-message-id="{reply.pk}"]')


def clipboard(page) -> str:
    return page.evaluate("navigator.clipboard.readText()")


def test_tables_code_and_copy_buttons(daphne, page):
    violations = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security" in m.text else 0)
    reply = open_rich(daphne, page)
    text = reply.locator(".part-text .md")
    expect(text.locator(".table-wrap table th")).to_have_count(3)
    expect(text.locator("td").first).to_have_text("Python")
    code = text.locator(".code-block pre code.language-python")
    expect(code.locator(".hljs-keyword").first).to_have_text("def")  # highlighted
    expect(code.locator(".hljs-string").first).to_be_visible()
    expect(text.locator("ol > li > ul > li")).to_have_count(2)  # nested list

    text.locator("button.copy-code").click()
    expect(text.locator("button.copy-code")).to_have_text("Copied")
    assert clipboard(page) == RICH_REPLY.split("```python\n")[1].split("\n```")[0]
    expect(text.locator("button.copy-code")).to_have_text("Copy", timeout=5_000)

    reply.locator(".message-head button.copy-message").click()
    assert clipboard(page) == RICH_REPLY  # the Markdown source, not the drawing
    user_message = page.locator(".message-user").last
    user_message.locator("button.copy-message").click()
    assert clipboard(page) == "Compare Python and Rust, and show a greeting function."
    assert violations == []


@pytest.mark.model
def test_escape_stops_the_streaming_reply(chat):
    chat.send("Write a long story about a lighthouse keeper and the sea.")
    chat.wait_text(5)
    part = chat.text_part
    expect(chat.reply.locator("button.stop")).to_be_visible()
    chat.page.keyboard.press("Escape")  # focus is still in the composer
    assert chat.wait_final(part) == "cancelled"
    expect(part.locator(".part-status")).to_have_text("stopped")
    expect(chat.reply.locator("button.stop")).to_have_count(0)
    expect(chat.reply).to_have_attribute("data-status", re.compile("failed|partial|complete"))


@pytest.mark.model
def test_escape_closes_the_settings_panel_first(chat):
    chat.page.click("#settings-panel summary")
    expect(chat.page.locator("#settings-form")).to_be_visible()
    chat.page.keyboard.press("Escape")
    expect(chat.page.locator("#settings-form")).to_be_hidden()
