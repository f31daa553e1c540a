"""Browser fixtures for the chat UI: a signed-in Chromium page on a conversation of its own.

Every wait is bounded (Playwright's expect / wait_for_function with a timeout); nothing sleeps
to synchronise. Replies come from the real model, so prompts ask for short answers.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import Locator, Page, expect

from chat.models import Part

REPLY_TIMEOUT = 90_000  # ms: a short reply at ~9 tokens/s, with room for a busy machine
SCREENSHOTS = os.environ.get("TANDEM_SCREENSHOTS", "")

# Records, on every DOM change, the newest text part's state, raw text and rendered length,
# so a test can see everything the page showed between two of its own looks. It watches the
# whole document, so installed with add_init_script it also sees a reload's first drawing.
RECORDER = """
(() => {
  window.__samples = [];
  const take = () => {
    const parts = document.querySelectorAll("#messages .part-text");
    const node = parts[parts.length - 1];
    if (!node || !window.tandem) return;
    const id = node.dataset.partId;
    const raw = window.tandem.partText(id);
    const last = window.__samples[window.__samples.length - 1];
    const sample = {
      id: Number(id), state: node.dataset.state, raw: raw,
      shown: node.querySelector(".md").textContent.length,
      caret: !!node.querySelector(".caret"),
    };
    if (!last || last.raw !== sample.raw || last.state !== sample.state || last.id !== sample.id) {
      window.__samples.push(sample);
    }
  };
  new MutationObserver(take).observe(document, {
    subtree: true, childList: true, characterData: true, attributes: true,
  });
  take();
})()
"""


def shot(page: Page, name: str) -> None:
    """Save a screenshot when TANDEM_SCREENSHOTS names a folder (docs/screenshots)."""
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"))


def make_user(prefix: str = "user"):
    username = f"{prefix}-{uuid.uuid4().hex[:6]}"
    password = f"pw-{uuid.uuid4().hex}"
    user = get_user_model().objects.create_user(username, password=password)
    return user, password


def sign_in(page: Page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")


@dataclass
class Chat:
    """A signed-in page on a new conversation, with the steps tests repeat.

    The conversation has no row, and so no id, until its first message is sent.
    """

    page: Page
    base_url: str
    user: object

    @property
    def conversation_id(self) -> int | None:
        """The conversation's id, from the page's address (None before the first message)."""
        found = re.search(r"/c/(\d+)/$", self.page.url)
        return int(found.group(1)) if found else None

    def send(self, text: str, image: bool = False, drawn: bool = True) -> None:
        """Type into the composer and press Enter; wait until the reply is drawn."""
        replies = self.page.locator(".message-assistant").count()
        box = self.page.locator("#composer input[name=image]")
        if box.is_checked() != image:
            box.set_checked(image, force=True)  # the real checkbox sits under a styled track
        self.page.fill("#composer textarea", text)
        self.page.press("#composer textarea", "Enter")
        if drawn:
            expect(self.page.locator(".message-assistant")).to_have_count(replies + 1)

    @property
    def reply(self) -> Locator:
        return self.page.locator(".message-assistant").last

    @property
    def text_part(self) -> Locator:
        return self.reply.locator(".part-text")

    @property
    def image_part(self) -> Locator:
        return self.reply.locator(".part-image")

    def part_id(self, part: Locator) -> int:
        return int(part.get_attribute("data-part-id"))

    def wait_text(self, min_chars: int, timeout: int = REPLY_TIMEOUT) -> None:
        """Wait until the newest text part is streaming and holds at least min_chars."""
        self.page.wait_for_function(
            """(n) => {
                const parts = document.querySelectorAll(".part-text");
                const node = parts[parts.length - 1];
                if (!node || node.dataset.state !== "streaming") return false;
                return (window.tandem.partText(node.dataset.partId) || "").length >= n;
            }""",
            arg=min_chars,
            timeout=timeout,
        )

    def wait_final(self, part: Locator, timeout: int = REPLY_TIMEOUT) -> str:
        expect(part).to_have_attribute(
            "data-state", re.compile("^(succeeded|failed|cancelled|interrupted)$"), timeout=timeout
        )
        return part.get_attribute("data-state")

    def shown_html(self, part: Locator) -> str:
        return part.locator(".md").inner_html()

    def rendered(self, text: str) -> str:
        """What the page's own renderer makes of `text` (to compare with the DOM)."""
        return self.page.evaluate(
            """(t) => {
                const box = document.createElement("div");
                box.innerHTML = window.TandemMarkdown.render(t);  // serialised as the DOM does
                return box.innerHTML;
            }""",
            text,
        )

    def raw_text(self, part_id: int) -> str:
        return self.page.evaluate("(id) => window.tandem.partText(id)", part_id)

    def record(self, from_next_load: bool = False) -> None:
        """Start recording now, or (from_next_load) from the first drawing of the next load."""
        if from_next_load:
            self.page.add_init_script(RECORDER)
        else:
            self.page.evaluate(RECORDER)

    def samples(self) -> list[dict]:
        return self.page.evaluate("window.__samples")


def db_part(part_id: int) -> Part:
    return Part.objects.get(pk=part_id)


def open_chat(page: Page, base_url: str, user, password: str) -> Chat:
    page.set_default_timeout(30_000)
    sign_in(page, base_url, user.get_username(), password)
    page.click("a.new-conversation")
    page.wait_for_url(re.compile(r".*/c/new$"))
    expect(page.locator("#connection")).to_have_attribute("data-connection", "new")
    return Chat(page, base_url, user)


@pytest.fixture
def chat(engine_server, page) -> Chat:
    """A signed-in user on a new conversation's page (no row yet, no socket)."""
    page.set_viewport_size({"width": 1280, "height": 800})
    user, password = make_user()
    return open_chat(page, engine_server.url, user, password)


def in_thread(function, *args):
    """Run sync code that must not see Playwright's event loop (async_to_sync, websockets)."""
    result: dict = {}

    def run():
        try:
            result["value"] = function(*args)
        except BaseException as error:  # handed back to the test thread
            result["error"] = error

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the helper thread did not finish"
    if "error" in result:
        raise result["error"]
    return result.get("value")
