"""A phone's 390 px: no sideways scrolling, the conversation list behind a button."""

import pytest
from playwright.sync_api import expect

from tests.chat_ui.conftest import make_user, sign_in
from tests.chat_ui.seeded import rich_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDEST = """() => Math.max(document.documentElement.scrollWidth, document.body.scrollWidth,
    ...[...document.querySelectorAll(".chat, .message-list, .composer, .chat-head")]
        .map(e => e.scrollWidth - e.clientWidth + window.innerWidth))"""


def test_the_conversation_fits_390_px_and_the_list_opens_from_a_button(daphne, page):
    page.set_viewport_size({"width": 390, "height": 844})
    user, password = make_user()
    convo, _ = rich_conversation(user)
    sign_in(page, daphne.url, user.get_username(), password)
    page.goto(f"{daphne.url}/c/{convo.pk}/")
    expect(page.locator(".part-text .table-wrap")).to_be_visible()
    assert page.evaluate(WIDEST) <= 390

    toggle = page.locator("#sidebar-toggle")
    sidebar = page.locator("#sidebar")
    expect(sidebar).to_be_hidden()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    toggle.click()
    expect(sidebar).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(sidebar.locator(f'a[data-conversation-id="{convo.pk}"]')).to_be_visible()
    page.keyboard.press("Escape")
    expect(sidebar).to_be_hidden()
    expect(toggle).to_be_focused()

    toggle.click()
    page.mouse.click(375, 420)  # a click outside it (on the messages) closes it
    expect(sidebar).to_be_hidden()

    page.goto(f"{daphne.url}/")  # the list page too
    assert page.evaluate(WIDEST) <= 390
    page.locator("#sidebar-toggle").click()
    expect(page.locator("#sidebar a.new-conversation")).to_be_visible()


def test_wide_screens_show_the_list_without_a_button(daphne, page):
    page.set_viewport_size({"width": 1280, "height": 800})
    user, password = make_user()
    sign_in(page, daphne.url, user.get_username(), password)
    expect(page.locator("#sidebar")).to_be_visible()
    expect(page.locator("#sidebar-toggle")).to_be_hidden()
