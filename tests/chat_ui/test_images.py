"""The image part: a placeholder with live progress, the picture, a failure card and retry.

A real Celery worker on the media queue draws the images (the procedural backend); the
failure is forced with the worker's own failure injection (TANDEM_IMAGE_FAILURE_RATE=1).
"""

import pytest
from playwright.sync_api import expect

from tests.chat_ui.conftest import REPLY_TIMEOUT, db_part, shot
from tests.support.media import start_worker

pytestmark = [pytest.mark.browser, pytest.mark.model, pytest.mark.django_db(transaction=True)]

IMAGE_RECORDER = """
() => {
  window.__images = [];
  const list = document.getElementById("messages");
  const take = () => {
    const parts = list.querySelectorAll(".part-image");
    const node = parts[parts.length - 1];
    if (!node) return;
    const bar = node.querySelector("[role=progressbar]");
    const sample = {
      state: node.dataset.state,
      progress: bar ? Number(bar.getAttribute("aria-valuenow")) : null,
      image: !!node.querySelector("img"),
    };
    const last = window.__images[window.__images.length - 1];
    if (!last || JSON.stringify(last) !== JSON.stringify(sample)) window.__images.push(sample);
  };
  new MutationObserver(take).observe(list, {subtree: true, childList: true, attributes: true});
}
"""


def part_kinds(chat) -> list[str]:
    return chat.reply.locator(".part").evaluate_all("nodes => nodes.map(n => n.dataset.kind)")


def assert_image_loads(chat, part_locator) -> None:
    img = part_locator.locator("figure img")
    expect(img).to_be_visible()
    src = img.get_attribute("src")
    saved = db_part(chat.part_id(part_locator))
    assert src == saved.image.url
    response = chat.page.request.get(f"{chat.base_url}{src}")
    assert response.status == 200, (
        f"GET {src} answered {response.status}: the server must serve MEDIA_URL "
        "(config/urls.py) for the picture to show"
    )
    chat.page.wait_for_function(
        "img => img.complete && img.naturalWidth > 0", arg=img.element_handle()
    )


def test_the_placeholder_fills_then_the_picture_shows(chat, celery_worker):
    chat.page.evaluate(IMAGE_RECORDER)
    chat.send("Say hello in five words.", image=True)
    # Both placeholders come with the 201 answer, in order: text first, image second.
    assert part_kinds(chat) == ["text", "image"]
    image = chat.image_part
    expect(image.locator(".image-placeholder [role=progressbar]")).to_be_visible()

    chat.page.wait_for_function(
        """() => {
            const node = [...document.querySelectorAll(".part-image")].pop();
            const bar = node && node.querySelector("[role=progressbar]");
            const done = bar ? Number(bar.getAttribute("aria-valuenow")) : 0;
            return node.dataset.state === "running" && done > 0;
        }""",
        timeout=60_000,
    )
    shot(chat.page, "image-in-progress")
    expect(image).to_have_attribute("data-state", "succeeded", timeout=60_000)
    assert chat.wait_final(chat.text_part) == "succeeded"
    assert_image_loads(chat, image)
    expect(chat.reply).to_have_attribute("data-status", "complete")
    expect(chat.reply.locator(".badge-partial")).to_have_count(0)
    shot(chat.page, "complete-reply-with-image")

    samples = chat.page.evaluate("window.__images")
    running = [s["progress"] for s in samples if s["state"] == "running"]
    assert len({p for p in running if 0 < p < 100}) >= 2, f"progress did not move: {samples}"
    assert running == sorted(running), f"progress went back: {running}"
    assert samples[-1] == {"state": "succeeded", "progress": None, "image": True}


def test_a_failed_image_keeps_the_text_and_its_retry_succeeds(chat, service_logs, request):
    worker = start_worker(service_logs, TANDEM_IMAGE_FAILURE_RATE="1", TANDEM_IMAGE_MAX_RETRIES="0")
    try:
        chat.send("Say hello in five words.", image=True)
        image, text = chat.image_part, chat.text_part
        expect(image).to_have_attribute("data-state", "failed", timeout=REPLY_TIMEOUT)
        assert chat.wait_final(text) == "succeeded"
    finally:
        worker.service.stop()

    expect(chat.reply).to_have_attribute("data-status", "partial")
    expect(chat.reply.locator(".badge-partial")).to_be_visible()
    expect(image.locator(".failure-reason")).to_contain_text("injected failure")
    saved_text = db_part(chat.part_id(text)).text
    text_html = chat.shown_html(text)
    assert saved_text and text_html == chat.rendered(saved_text)
    shot(chat.page, "partial-reply-with-failure-card")

    image.locator("button.retry-image").click()
    expect(image).to_have_attribute("data-state", "queued")
    expect(image).to_have_attribute("data-attempt", "2")
    expect(image.locator(".part-status")).to_contain_text("waiting")
    expect(chat.reply).to_have_attribute("data-status", "in_progress")

    request.getfixturevalue("celery_worker")  # a healthy worker picks the retry up
    expect(image).to_have_attribute("data-state", "succeeded", timeout=60_000)
    assert_image_loads(chat, image)
    expect(chat.reply).to_have_attribute("data-status", "complete")
    expect(chat.reply.locator(".badge-partial")).to_have_count(0)
    assert chat.shown_html(text) == text_html  # the text was never touched
    assert db_part(chat.part_id(text)).text == saved_text
    assert db_part(chat.part_id(image)).attempt == 2


def test_new_image_keeps_the_old_picture_until_the_new_one_is_drawn(chat, celery_worker):
    page = chat.page
    page.click("#settings-panel summary")  # a short text: the test is about the image
    page.fill("#setting-max_new_tokens", "8")
    page.click("#settings-form button[type=submit]")
    page.click("#settings-panel summary")
    chat.send("Draw a small boat.", image=True)
    image = chat.image_part
    expect(image).to_have_attribute("data-state", "succeeded", timeout=REPLY_TIMEOUT)
    old = image.locator("figure img").get_attribute("src")
    chat.page.evaluate(IMAGE_RECORDER)

    image.locator("button.new-image").click()
    expect(image).to_have_attribute("data-previous", "true")
    expect(image.locator(".redraw-status")).to_be_visible()
    assert image.locator("figure img").get_attribute("src") == old  # still on screen
    expect(image).to_have_attribute("data-state", "succeeded", timeout=REPLY_TIMEOUT)
    new = image.locator("figure img").get_attribute("src")
    assert new != old
    assert_image_loads(chat, image)
    # Never an empty frame between the two pictures.
    samples = chat.page.evaluate("window.__images")
    assert samples and all(sample["image"] for sample in samples)
    assert db_part(chat.part_id(image)).attempt == 2
    assert chat.page.request.get(f"{chat.base_url}{old}").status == 404  # its file went
