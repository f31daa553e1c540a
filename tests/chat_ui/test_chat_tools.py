"""Markdown in the page (tables, highlighted code), the copy buttons, and Esc to stop."""

import re

import pytest
from playwright.sync_api import expect

from chat import events
from chat.models import Conversation, Message, Part
from tests.chat_ui.conftest import in_thread, make_user, sign_in
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


def test_streaming_markdown_keeps_finished_blocks(daphne, page):
    """Pieces sent as the stream writer sends them (channel layer, real socket): finished
    blocks keep their DOM nodes while later ones grow, and the end equals a fresh render."""
    user, password = make_user()
    convo = Conversation.objects.create(owner=user, title="Streaming Markdown")
    Message.objects.create(conversation=convo, role="user", position=0, text="Go.")
    reply = Message.objects.create(conversation=convo, role="assistant", position=1)
    part = Part.objects.create(message=reply, index=0, kind="text", state="streaming")
    sign_in(page, daphne.url, user.get_username(), password)
    page.goto(f"{daphne.url}/c/{convo.pk}/")
    expect(page.locator("#connection")).to_have_attribute("data-connection", "open")
    md = page.locator(f'[data-part-id="{part.pk}"] .md')
    pieces = ["Intro ", "paragraph.\n\n", "```python\nx = ", "1\n```\n\n", "More"]
    pieces += [" words"] * 20 + [".\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\nEnd."]

    def send_pieces(first_seq, chunk):
        for offset, text in enumerate(chunk):
            events.send(convo.pk, events.delta_event(part.pk, reply.pk, first_seq + offset, text))

    in_thread(send_pieces, 1, pieces[:5])
    expect(md.locator("p").last).to_contain_text("More")
    kept = """(id) => {  // a property, not an attribute: the nodes must stay equal to a render
        const md = document.querySelector(`[data-part-id="${id}"] .md`);
        return [md.children[0], md.querySelector(".code-block")];
    }"""
    page.evaluate(f"(id) => ({kept})(id).forEach(n => {{ n.keptMark = true; }})", part.pk)
    in_thread(send_pieces, 6, pieces[5:])
    expect(md.locator("table td").last).to_have_text("2")
    expect(md.locator(".caret")).to_have_count(1)
    # the same nodes, not redrawn copies
    assert page.evaluate(f"(id) => ({kept})(id).map(n => n.keptMark === true)", part.pk) == [
        True,
        True,
    ]
    expect(md.locator(".code-block .hljs-number")).to_have_text("1")
    html = md.evaluate(
        "n => { const c = n.cloneNode(true); c.querySelector('.caret').remove();"
        " return c.innerHTML; }"
    )
    assert html == page.evaluate(
        "t => { const b = document.createElement('div');"
        " b.innerHTML = window.TandemMarkdown.render(t); return b.innerHTML; }",
        "".join(pieces),
    )
