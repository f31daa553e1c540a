"""The README's screenshots, made on a stack of their own: `make screenshots`.

Starts a private redis-server, a SQLite database and media folder in a temporary directory,
Daphne with the real model, and a Celery worker whose images all fail
(TANDEM_IMAGE_FAILURE_RATE=1, so a reply with an image ends partial); drives Debian's
Chromium through real turns; writes docs/screenshots/*.png; stops what it started, by pid.
The reply with a table and code is a saved reply (the 135M model rarely writes one); every
other picture is the real model's reply. Not part of `make test`.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "screenshots"
REPLY_TIMEOUT = 180_000  # ms: a short reply on a busy two-core machine


def configure(workdir: Path, redis_port: int) -> None:
    """Point this process (and so its children) at the private database, media and Redis."""
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DEBUG": "1",
            "DATABASE_URL": f"sqlite:///{workdir / 'screens.sqlite3'}",
            "MEDIA_ROOT": str(workdir / "media"),
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def final(locator, timeout: int = REPLY_TIMEOUT) -> None:
    from playwright.sync_api import expect

    expect(locator).to_have_attribute(
        "data-state", re.compile("^(succeeded|failed|cancelled|interrupted)$"), timeout=timeout
    )


def send(page, text: str, image: bool) -> None:
    from playwright.sync_api import expect

    replies = page.locator(".message-assistant").count()
    page.locator("#composer input[name=image]").set_checked(image, force=True)
    page.fill("#composer textarea", text)
    page.press("#composer textarea", "Enter")
    expect(page.locator(".message-assistant")).to_have_count(replies + 1)


def new_conversation(page, base_url: str, max_new_tokens: int) -> None:
    page.goto(f"{base_url}/c/new")
    page.click("#settings-panel summary")
    page.fill("#setting-max_new_tokens", str(max_new_tokens))
    page.click("#settings-form button[type=submit]")
    page.click("#settings-panel summary")


def versions_shot(page, base_url: str) -> None:
    """A reply regenerated twice, its second version shown: "‹ 2 / 3 ›"."""
    from playwright.sync_api import expect

    new_conversation(page, base_url, 40)
    send(page, "Name an animal and say one thing about it.", image=False)
    reply = page.locator(".message-assistant").last
    head = reply.locator(".message-head")
    final(reply.locator(".part-text"))
    for shown in ("2 / 2", "3 / 3"):
        head.locator("button.regenerate").click()
        expect(head.locator(".version-label")).to_have_text(shown)
        final(reply.locator(".part-text"))
    head.locator("button.version-step[aria-label='Previous version']").click()
    expect(head.locator(".version-label")).to_have_text("2 / 3")
    final(reply.locator(".part-text"))
    page.screenshot(path=str(OUT / "reply-versions-2-of-3.png"))


def partial_shot(page, base_url: str) -> None:
    """The text done, the image failed (every image fails on this worker): partial."""
    from playwright.sync_api import expect

    new_conversation(page, base_url, 40)
    send(page, "Describe a sailing boat in two sentences.", image=True)
    reply = page.locator(".message-assistant").last
    final(reply.locator(".part-text"))
    final(reply.locator(".part-image"))
    expect(reply).to_have_attribute("data-status", "partial")
    page.screenshot(path=str(OUT / "partial-reply-with-failure-card.png"))


def markdown_shots(page, base_url: str, user) -> None:
    """A reply with a table, highlighted code and a nested list, wide and at 390 px."""
    from playwright.sync_api import expect

    from tests.chat_ui.seeded import rich_conversation

    convo, _ = rich_conversation(user)
    page.goto(f"{base_url}/c/{convo.pk}/")
    expect(page.locator(".code-block .hljs-keyword").first).to_be_visible()
    page.screenshot(path=str(OUT / "markdown-table-and-code.png"))
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(page.locator(".code-block .hljs-keyword").first).to_be_visible()
    page.screenshot(path=str(OUT / "mobile-390.png"))
    page.click("#sidebar-toggle")
    expect(page.locator("#sidebar")).to_be_visible()
    page.screenshot(path=str(OUT / "mobile-390-conversations.png"))


def main() -> int:
    from tests.support.processes import free_port

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tandem-screens-") as tmp:
        workdir = Path(tmp)
        redis_port = free_port()
        configure(workdir, redis_port)

        from django.contrib.auth import get_user_model
        from playwright.sync_api import sync_playwright

        from tests.conftest import CHROMIUM, CHROMIUM_ARGS, start_daphne, wait_for_model
        from tests.support.media import RedisServer, start_worker

        redis_server = RedisServer(redis_port, workdir).start()
        started = [redis_server]
        try:
            worker = start_worker(workdir, TANDEM_IMAGE_FAILURE_RATE="1")
            started.append(worker.service)
            server = start_daphne("daphne-screens", workdir)
            started.append(server.service)
            print("waiting for the model…", flush=True)
            wait_for_model(server, timeout=600)
            user = get_user_model().objects.create_user("demo", password="demo")
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM calls beside Playwright
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
                )
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(60_000)
                page.goto(f"{server.url}/accounts/login/")
                page.fill("#id_username", "demo")
                page.fill("#id_password", "demo")
                page.click("button[type=submit]")
                page.wait_for_url(f"{server.url}/")
                versions_shot(page, server.url)
                partial_shot(page, server.url)
                markdown_shots(page, server.url, user)
                browser.close()
        finally:
            for service in reversed(started):
                service.stop()
    for name in sorted(OUT.glob("*.png")):
        print(name.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
