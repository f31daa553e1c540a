"""Hostile markup in prompts, titles and model output renders inert in the real Chromium.

Every payload, if it ever ran, would set `window.__xss`. The page is loaded with them saved
(the server-rendered snapshot) and then sent them live as model text through the live
events and the real socket, as the stream writer does (the model cannot be made to emit them
on demand, so this is the one injected fault). A control image with an onerror handler, added
by the test itself, proves that handlers in this page do fire: once it has, the payloads' own
error events have had their turn too, so nothing waits on a timer. The page's
Content-Security-Policy would block an inline handler too, so the test also requires that
the policy saw nothing to block: the renderer alone keeps the payloads inert.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from chat import events
from chat.models import Conversation, Message, Part
from tests.chat_ui.conftest import in_thread, make_user, sign_in
from tests.chat_ui.test_security import assert_inert
from tests.security.test_csp import WATCH, violations

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAYLOADS = [
    "<script>window.__xss = 1</script>",
    '<img src=x onerror="window.__xss = 2">',
    '<svg onload="window.__xss = 3"></svg>',
    "[click me](javascript:window.__xss=4)",
    '<a href="javascript:window.__xss = 5">link</a>',
    '<iframe srcdoc="<script>parent.__xss = 6</script>"></iframe>',
    '![pic](x" onerror="window.__xss=7)',
    '<details open ontoggle="window.__xss = 8">d</details>',
    "</script><script>window.__xss = 9</script>",
    '<div style="background:url(javascript:window.__xss=10)">s</div>',
    "[a](data:text/html,<script>window.__xss=11</script>)",
    "{{ 7|add:7 }} ${7*7} <!-- comment --> &lt;b&gt;",
]
HOSTILE = "\n\n".join(PAYLOADS)
# What must be shown literally (as text) wherever the payloads were rendered.
LITERAL = ["<script>window.__xss = 1</script>", '<img src=x onerror="window.__xss = 2">', "{{ 7"]


def assert_nothing_ran(page, dialogs: list) -> None:
    page.evaluate(
        """() => {
            const probe = document.createElement("img");
            probe.onerror = () => { window.__control = 1; };
            probe.src = "/no-such-image-" + Math.random();
            document.body.appendChild(probe);
        }"""
    )
    page.wait_for_function("() => window.__control === 1", timeout=15_000)
    assert page.evaluate("window.__xss") is None
    assert dialogs == []
    # Not even attempted: the Content-Security-Policy saw no inline script or handler to block.
    assert violations(page) == []


def test_hostile_markup_stays_text_when_saved_or_streamed(daphne, page):
    user, password = make_user("xss")
    conversation = Conversation.objects.create(owner=user, title=PAYLOADS[8] + PAYLOADS[1])
    Message.objects.create(conversation=conversation, role="user", position=0, text=HOSTILE)
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    part = Part.objects.create(
        message=reply, index=0, kind="text", state="succeeded", text=HOSTILE, seq=1
    )
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.set_default_timeout(30_000)
    page.add_init_script(WATCH)
    sign_in(page, daphne.url, user.get_username(), password)
    page.goto(f"{daphne.url}/c/{conversation.pk}/")
    expect(page.locator("#connection")).to_have_attribute("data-connection", "open")

    user_text = page.locator(".message-user .md").last
    model_text = page.locator(f'.part-text[data-part-id="{part.pk}"] .md')
    for node in (user_text, model_text):
        for literal in LITERAL:
            expect(node).to_contain_text(literal)
        assert_inert(node, dialogs)
    expect(page.locator("#conversation-title")).to_have_text(PAYLOADS[8] + PAYLOADS[1])
    for link in page.locator(".md a").all():
        link.hover()
    assert_nothing_ran(page, dialogs)
    rendered = len(PAYLOADS) * 2

    streamed = HOSTILE + "\n\n```html\n" + PAYLOADS[0] + "\n```"
    payload = events.part_payload(part) | {"text": streamed, "seq": part.seq + 1}
    in_thread(events.send, conversation.pk, {"type": "part.state", "part": payload})
    expect(model_text.locator("pre code")).to_have_text(PAYLOADS[0])
    for literal in LITERAL:
        expect(model_text).to_contain_text(literal)
    assert_inert(model_text, dialogs)
    assert_nothing_ran(page, dialogs)
    rendered += len(PAYLOADS) + 1
    # The detector works: the same payload put in as HTML is attempted, and the policy (the
    # second line of defence, docs/security.md) blocks its inline handler and says so.
    page.evaluate("(html) => document.body.insertAdjacentHTML('beforeend', html)", PAYLOADS[1])
    page.wait_for_function("() => window.__violations.length > 0", timeout=15_000)
    assert [v["directive"] for v in violations(page)] == ["script-src-attr"]
    assert page.evaluate("window.__xss") is None
    print(
        f"\nxss: {len(PAYLOADS)} payloads, {rendered} renderings (saved user text, saved model "
        "text, live model text) + the title, 0 scripts ran, 0 dialogs"
    )
