"""Neither a user nor the model can inject markup, and nobody opens another's conversation."""

import json

import pytest
from django.test import Client
from playwright.sync_api import expect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from chat import events
from chat.models import Conversation
from tests.chat_ui.conftest import db_part, in_thread, make_user, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTILE = (
    "<img src=x onerror=alert(1)> and <script>alert(2)</script> "
    '**bold** [click](javascript:alert(3)) [x](http://a.example/" onmouseover="alert(4))'
)


def assert_inert(node, dialogs):
    """No element the text asked for was made; only the safe subset's tags are there."""
    assert node.locator("script, img, iframe, svg, object, embed").count() == 0
    for link in node.locator("a").all():
        assert link.get_attribute("href").startswith(("http://", "https://"))
        assert link.get_attribute("rel") == "noopener noreferrer"
        assert link.get_attribute("onmouseover") is None
    attributes = node.evaluate(
        "n => [...n.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))"
    )
    assert not [name for name in attributes if name.startswith("on")]
    assert dialogs == []


@pytest.mark.model
def test_markup_from_the_user_or_the_model_renders_as_text(chat):
    dialogs = []
    chat.page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    chat.send(HOSTILE)
    user_text = chat.page.locator(".message-user").last.locator(".md")
    expect(user_text).to_contain_text("<img src=x onerror=alert(1)> and <script>alert(2)</script>")
    expect(user_text.locator("strong")).to_have_text("bold")
    expect(user_text).to_contain_text("[click](javascript:alert(3))")
    assert_inert(user_text, dialogs)

    # The model's side: stop the real reply, then send its part the same markup as model
    # text, through the live events and the real socket, as the stream writer would.
    part = chat.text_part
    if chat.reply.locator("button.stop").count():
        chat.reply.locator("button.stop").click()
    chat.wait_final(part)
    saved = db_part(chat.part_id(part))
    payload = events.part_payload(saved) | {
        "text": HOSTILE + "\n\n```\n<script>alert(5)</script>\n```",
        "seq": saved.seq + 1,
    }
    in_thread(events.send, chat.conversation_id, {"type": "part.state", "part": payload})
    shown = part.locator(".md")
    expect(shown).to_contain_text("<img src=x onerror=alert(1)>")
    expect(shown.locator("pre code")).to_have_text("<script>alert(5)</script>")
    assert_inert(shown, dialogs)


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


# A consumer that closes before accepting makes Daphne refuse the handshake with HTTP 403;
# one that accepts first closes with 4404. Either way the socket carries nothing.
REFUSED = ("http 403", 4404)


def first_frame(url: str, cookie: str, origin: str):
    """The first frame a socket gets, or how it was refused or closed."""
    try:
        with connect(
            url, additional_headers={"Cookie": cookie, "Origin": origin}, open_timeout=10
        ) as ws:
            try:
                return json.loads(ws.recv(timeout=10))
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None
    except InvalidStatus as refused:
        return f"http {refused.response.status_code}"


def test_another_users_conversation_is_not_found_by_url_or_socket(daphne, page):
    alice, _ = make_user("alice")
    bob, bob_password = make_user("bob")
    secret = Conversation.objects.create(owner=alice, title="alice's secret")

    sign_in(page, daphne.url, bob.get_username(), bob_password)
    response = page.goto(f"{daphne.url}/c/{secret.pk}/")
    assert response.status == 404
    assert "alice's secret" not in page.content()
    page.goto(f"{daphne.url}/")
    expect(page.locator(".conversation-list")).not_to_contain_text("alice's secret")

    url = f"{daphne.ws_url}/ws/conversations/{secret.pk}/"
    owner = in_thread(first_frame, url, session_cookie(alice), daphne.url)
    assert owner == {"type": "snapshot", "messages": []}  # the owner gets in
    assert in_thread(first_frame, url, session_cookie(bob), daphne.url) in REFUSED
    bob_cookie = next(c for c in page.context.cookies() if c["name"] == "sessionid")
    assert in_thread(first_frame, url, f"sessionid={bob_cookie['value']}", daphne.url) in REFUSED
    missing = f"{daphne.ws_url}/ws/conversations/{secret.pk + 1000}/"
    assert in_thread(first_frame, missing, session_cookie(bob), daphne.url) in REFUSED
