"""In the browser, a reply whose text comes from a remote engine (an engine-only Tandem, through
TANDEM_ENGINE) streams exactly as one from the web process's own engine: the same growing
text, caret and final state, and the same words (synthetic tokens, the same prompt)."""

import pytest

from tests.chat_ui.conftest import db_part, make_user, open_chat
from tests.conftest import serving

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SYNTHETIC = {
    "TANDEM_ENGINE_SOURCE": "synthetic",
    "TANDEM_SYNTHETIC_TOKENS_PER_S": "30",
}
WEB = {"TANDEM_CHAT_MAX_NEW_TOKENS": "40"}


def stream_one_reply(chromium, server) -> tuple[str, list[dict]]:
    """Send the same message on a new conversation, in a browser context of its own; the saved
    text and what the page showed."""
    context = chromium.new_context()
    try:
        return stream_in(context.new_page(), server)
    finally:
        context.close()


def stream_in(page, server) -> tuple[str, list[dict]]:
    user, password = make_user()
    chat = open_chat(page, server.url, user, password)
    chat.record()
    chat.send("Tell me how streaming works.")
    part = chat.text_part
    part_id = chat.part_id(part)
    assert chat.wait_final(part) == "succeeded"
    text = db_part(part_id).text
    assert chat.shown_html(part) == chat.rendered(text)
    return text, [s for s in chat.samples() if s["id"] == part_id]


def growth(samples: list[dict]) -> tuple[int, bool, bool]:
    """How the page drew the reply: steps of visible growth, a caret while streaming, none
    after."""
    streaming = [s for s in samples if s["state"] == "streaming"]
    steps = len({s["shown"] for s in streaming if s["shown"] > 0})
    return steps, any(s["caret"] for s in streaming), not samples[-1]["caret"]


def test_a_remote_reply_streams_in_the_page_like_a_local_one(chromium, service_logs):
    with (
        serving(
            "engine-box-ui", service_logs, TANDEM_ROLE="engine", timeout=120, **SYNTHETIC
        ) as box,
        serving("web-remote-ui", service_logs, TANDEM_ENGINE=box.url, **WEB) as web,
    ):
        remote_text, remote_samples = stream_one_reply(chromium, web)
    with serving("web-local-ui", service_logs, timeout=120, **SYNTHETIC, **WEB) as web:
        local_text, local_samples = stream_one_reply(chromium, web)

    assert remote_text == local_text and remote_text.strip()
    steps, caret, caret_gone = growth(remote_samples)
    assert steps >= 3 and caret and caret_gone, remote_samples
    local_steps, _, _ = growth(local_samples)
    assert local_steps >= 3
    for samples, text in ((remote_samples, remote_text), (local_samples, local_text)):
        raw = [len(s["raw"]) for s in samples]
        assert raw == sorted(raw) and all(text.startswith(s["raw"]) for s in samples)
