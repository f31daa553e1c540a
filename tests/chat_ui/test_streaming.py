"""The reply's text streams into the page, survives a reload, and stops on demand."""

import pytest
from playwright.sync_api import expect

from chat.models import Conversation
from tests.chat_ui.conftest import db_part, shot

pytestmark = [pytest.mark.browser, pytest.mark.model, pytest.mark.django_db(transaction=True)]


def test_tokens_appear_one_by_one_before_the_reply_ends(chat):
    chat.record()
    chat.send("Name one fruit and say why you like it.")
    part = chat.text_part
    part_id = chat.part_id(part)
    # The placeholder is drawn from the 201 answer, before any token exists.
    expect(part).to_have_count(1)
    chat.wait_text(8)
    shot(chat.page, "streaming-reply")
    # Enough has been seen after 80 characters: a rambling reply is stopped there.
    chat.page.wait_for_function(
        """(id) => {
            const node = document.querySelector(`[data-part-id="${id}"]`);
            return node.dataset.state !== "streaming" || window.tandem.partText(id).length >= 80;
        }""",
        arg=part_id,
        timeout=60_000,
    )
    if part.get_attribute("data-state") == "streaming":
        chat.reply.locator("button.stop").click()
    assert chat.wait_final(part) in ("succeeded", "cancelled")

    samples = [s for s in chat.samples() if s["id"] == part_id]
    streaming = [s for s in samples if s["state"] == "streaming"]
    shown = [s["shown"] for s in streaming]
    raw = [len(s["raw"]) for s in streaming]
    assert len({n for n in shown if n > 0}) >= 3, f"the text did not grow in steps: {shown}"
    assert raw == sorted(raw), f"the streaming text shrank: {raw}"
    assert any(s["caret"] for s in streaming), "no caret while streaming"
    final = samples[-1]
    assert final["state"] in ("succeeded", "cancelled") and not final["caret"]
    assert max(raw) <= len(final["raw"])
    # Every text the page showed on the way was a prefix of what was saved.
    text = db_part(part_id).text
    assert text and all(text.startswith(s["raw"]) for s in samples)
    assert chat.shown_html(part) == chat.rendered(text)
    expect(chat.reply.locator("button.stop")).to_have_count(0)


def test_a_reload_mid_stream_resumes_without_losing_or_repeating_text(chat):
    chat.send("Write a short poem about the sea, in eight lines.")
    part = chat.text_part
    part_id = chat.part_id(part)
    chat.wait_text(20)
    before = chat.raw_text(part_id)

    chat.record(from_next_load=True)
    chat.page.reload()
    expect(chat.page.locator("#connection")).to_have_attribute("data-connection", "open")
    part = chat.page.locator(f'[data-part-id="{part_id}"]')
    # It picks up where it was and keeps growing live after the reload.
    chat.page.wait_for_function(
        "([id, n]) => (window.tandem.partText(id) || '').length >= n",
        arg=[part_id, len(before) + 15],
        timeout=60_000,
    )
    if part.get_attribute("data-state") == "streaming":
        chat.reply.locator("button.stop").click()  # no need to wait for the whole poem
    chat.wait_final(part)

    saved = db_part(part_id)
    assert saved.text.startswith(before)
    assert chat.raw_text(part_id) == saved.text
    assert chat.shown_html(part) == chat.rendered(saved.text)
    assert part.get_attribute("data-seq") == str(saved.seq)
    seen = [s["raw"] for s in chat.samples() if s["id"] == part_id]
    assert len(seen) > 2
    assert len(seen[0]) >= len(before), "the reload lost text it had shown"
    assert all(saved.text.startswith(raw) for raw in seen), "a repeated or lost piece was shown"


def test_stop_keeps_the_text_and_says_stopped(chat):
    chat.send("Write a long story about a dragon.")
    part = chat.text_part
    chat.wait_text(15)
    chat.reply.locator("button.stop").click()
    expect(part).to_have_attribute("data-state", "cancelled", timeout=30_000)
    expect(part.locator(".part-status")).to_have_text("stopped")
    expect(chat.reply.locator("button.stop")).to_have_count(0)

    saved = db_part(chat.part_id(part))
    assert saved.state == "cancelled" and saved.text.strip()
    assert chat.raw_text(saved.pk) == saved.text
    assert chat.shown_html(part) == chat.rendered(saved.text)
    assert part.locator(".md").inner_text().strip()


def test_a_second_tab_follows_the_reply_and_can_stop_it(chat):
    # Both tabs on one saved conversation (a new one has no row, and no socket, until its
    # first message).
    conversation = Conversation.objects.create(owner=chat.user)
    chat.page.goto(f"{chat.base_url}/c/{conversation.pk}/")
    expect(chat.page.locator("#connection")).to_have_attribute("data-connection", "open")
    other = chat.page.context.new_page()
    other.goto(chat.page.url)
    expect(other.locator("#connection")).to_have_attribute("data-connection", "open")

    chat.send("Write a long story about a dragon.")
    part_id = chat.part_id(chat.text_part)
    mirrored = other.locator(f'[data-part-id="{part_id}"]')
    expect(other.locator(".message-user .md")).to_have_text("Write a long story about a dragon.")
    other.wait_for_function(
        "(id) => (window.tandem.partText(id) || '').length >= 10", arg=part_id, timeout=60_000
    )
    other.locator("button.stop").click()
    for page in (chat.page, other):
        expect(page.locator(f'[data-part-id="{part_id}"]')).to_have_attribute(
            "data-state", "cancelled", timeout=30_000
        )
    saved = db_part(part_id)
    assert chat.raw_text(part_id) == saved.text
    assert other.evaluate("(id) => window.tandem.partText(id)", part_id) == saved.text
    assert mirrored.locator(".md").inner_html() == chat.shown_html(chat.text_part)
