"""Managing conversations in the browser: created by the first message, renamed inline,
deleted (another open tab hears of it), searched, exported."""

import json
import re

import pytest
from playwright.sync_api import expect

from chat.models import Conversation, Message, Part
from tests.chat_ui.conftest import make_user, shot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTILE_TITLE = '<img src=x onerror="window.__xss = 1"> Lyon'


@pytest.mark.model
def test_the_first_message_creates_the_conversation(chat):
    page = chat.page
    assert chat.conversation_id is None
    expect(page.locator("#chat-actions")).to_be_hidden()  # nothing to rename or delete yet
    page.reload()  # opening or reloading the new page saves nothing
    assert not Conversation.objects.filter(owner=chat.user).exists()

    chat.send("Say hello in three words.")
    page.wait_for_url(re.compile(r".*/c/\d+/$"))
    conversation = Conversation.objects.get(owner=chat.user)
    assert chat.conversation_id == conversation.pk
    expect(page.locator("#connection")).to_have_attribute("data-connection", "open")
    link = page.locator('.conversation-list a[aria-current="page"]')
    expect(link).to_have_text("Say hello in three words.")
    expect(page.locator("#conversation-title")).to_have_text("Say hello in three words.")
    expect(page.locator("#chat-actions")).to_be_visible()
    assert chat.wait_final(chat.text_part) == "succeeded"  # followed live on the new socket
    shot(page, "conversation-first-message")

    chat.send("And in two?")
    assert chat.wait_final(chat.text_part) == "succeeded"
    assert Conversation.objects.filter(owner=chat.user).count() == 1
    assert Message.objects.filter(conversation=conversation).count() == 4


def saved_conversation(owner, title: str, words: str = "Hello there.") -> Conversation:
    conversation = Conversation.objects.create(owner=owner, title=title)
    Message.objects.create(conversation=conversation, role="user", position=0, text=words)
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    Part.objects.create(
        message=reply, index=0, kind="text", state="succeeded", text="Hi! How can I help?", seq=1
    )
    return conversation


def open_page(page, server, user, password, conversation: Conversation):
    page.set_default_timeout(30_000)
    sign_in(page, server.url, user.get_username(), password)
    page.goto(f"{server.url}/c/{conversation.pk}/")
    expect(page.locator("#connection")).to_have_attribute("data-connection", "open")


def test_rename_inline_shows_errors_and_reaches_other_tabs(daphne, page):
    user, password = make_user("rename")
    conversation = saved_conversation(user, "Travel")
    open_page(page, daphne, user, password, conversation)
    other = page.context.new_page()
    other.goto(f"{daphne.url}/c/{conversation.pk}/")
    expect(other.locator("#connection")).to_have_attribute("data-connection", "open")

    page.click("#rename")
    box = page.locator("#rename-input")
    expect(box).to_be_focused()
    expect(box).to_have_value("Travel")
    box.fill("   ")
    box.press("Enter")
    expect(page.locator("#rename-error")).to_have_text("A title cannot be empty.")
    expect(box).to_have_attribute("aria-invalid", "true")
    box.press("Escape")  # gives up: the old title is back
    expect(page.locator("#conversation-title")).to_have_text("Travel")
    assert Conversation.objects.get(pk=conversation.pk).title == "Travel"

    page.click("#rename")
    box.fill(HOSTILE_TITLE)
    shot(page, "conversation-rename")
    box.press("Enter")
    for tab in (page, other):  # shown as text, here and in the other tab, live
        expect(tab.locator("#conversation-title")).to_have_text(HOSTILE_TITLE)
        link = tab.locator(f'.conversation-list a[data-conversation-id="{conversation.pk}"]')
        expect(link).to_have_text(HOSTILE_TITLE)
        assert tab.locator("#conversation-title img, .conversation-list img").count() == 0
        assert tab.evaluate("window.__xss") is None
    expect(page.locator("#rename-form")).to_be_hidden()
    assert Conversation.objects.get(pk=conversation.pk).title == HOSTILE_TITLE
    page.reload()
    expect(page.locator("#conversation-title")).to_have_text(HOSTILE_TITLE)


def test_delete_asks_first_then_goes_home_and_closes_other_tabs(daphne, page):
    user, password = make_user("delete")
    kept = saved_conversation(user, "Keep me")
    doomed = saved_conversation(user, "Delete me")
    open_page(page, daphne, user, password, doomed)
    other = page.context.new_page()
    other.goto(f"{daphne.url}/c/{doomed.pk}/")
    expect(other.locator("#connection")).to_have_attribute("data-connection", "open")

    page.click("#delete")
    expect(page.locator("#delete-confirm")).to_be_visible()
    shot(page, "conversation-delete")
    page.click("#delete-no")  # changed my mind
    expect(page.locator("#delete-confirm")).to_be_hidden()
    assert Conversation.objects.filter(pk=doomed.pk).exists()

    page.click("#delete")
    page.click("#delete-yes")
    page.wait_for_url(f"{daphne.url}/")
    expect(page.locator(f'[data-conversation-id="{doomed.pk}"]')).to_have_count(0)
    expect(page.locator(f'[data-conversation-id="{kept.pk}"]')).to_have_count(1)
    assert not Conversation.objects.filter(pk=doomed.pk).exists()

    expect(other.locator("#connection")).to_have_text("this conversation was deleted")
    expect(other.locator("#composer textarea")).to_be_disabled()
    assert page.goto(f"{daphne.url}/c/{doomed.pk}/").status == 404


def test_search_lists_only_the_matching_conversations(daphne, page):
    user, password = make_user("search")
    soup = saved_conversation(user, "Dinner", "How long does a tomato soup take?")
    kites = saved_conversation(user, "Kites", "Which kite for a beach?")
    page.set_default_timeout(30_000)
    sign_in(page, daphne.url, user.get_username(), password)
    search = page.locator("#conversation-search")
    search.fill("tomato")
    search.press("Enter")
    page.wait_for_url(re.compile(r".*\?q=tomato$"))
    listed = page.locator(".conversation-list a[data-conversation-id]")
    expect(listed).to_have_count(1)
    expect(listed).to_have_text("Dinner")
    expect(page.locator(".search-summary")).to_contain_text("1 match for “tomato”")
    expect(search).to_have_value("tomato")
    shot(page, "conversation-search")
    search.fill("nothing-like-this")
    search.press("Enter")
    expect(listed).to_have_count(0)
    page.click(".search-summary a")  # show all
    expect(listed).to_have_count(2)
    assert {int(a.get_attribute("data-conversation-id")) for a in listed.all()} == {
        soup.pk,
        kites.pk,
    }


def test_export_downloads_markdown_and_json(daphne, page):
    user, password = make_user("export")
    conversation = saved_conversation(user, "Greetings")
    open_page(page, daphne, user, password, conversation)
    with page.expect_download() as markdown:
        page.click("#export-md")
    assert markdown.value.suggested_filename == f"greetings-{conversation.pk}.md"
    text = markdown.value.path().read_text(encoding="utf-8")
    assert text.startswith("# Greetings\n") and "Hi! How can I help?" in text
    with page.expect_download() as as_json:
        page.click("#export-json")
    document = json.loads(as_json.value.path().read_text(encoding="utf-8"))
    assert document["messages"][1]["parts"][0]["state"] == "succeeded"
