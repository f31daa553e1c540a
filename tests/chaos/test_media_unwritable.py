"""The media folder cannot be written: the image fails with a reason the user reads, the text
stays, and Retry draws it once the folder is writable again.

A Daphne and a worker of the scenario's own share a fresh MEDIA_ROOT, which is made
unwritable for real before a turn asks for an image: `chmod 555` for an ordinary user, and
for root (whom file modes do not stop) the immutable attribute (`chattr +i`), which refuses
root's writes too. The worker draws the picture, its save fails with EACCES or EPERM, and the
part fails at once with the reason in words (`media/rendering.py` `store`), which the page
shows on the failure card; the text part is untouched and the message is partial. Then the
folder is made writable again and the page's "Retry image" draws and stores the picture.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from chat.models import Part
from tests.chaos import conftest as chaos
from tests.chat_ui.conftest import Chat
from tests.conftest import start_daphne, wait_for_model
from tests.support.media import start_worker

pytestmark = chaos.BROWSER_SCENARIO

RENDER = {"TANDEM_IMAGE_STEPS": "6", "TANDEM_IMAGE_STEP_DELAY": "0.2"}
FAIL_BOUND = 60.0  # seconds from the turn until the image must have failed
RETRY_BOUND = 60.0  # seconds from Retry until the picture must be stored
REASON = "could not be saved"
PROMPT = "A red kite over a green hill"


class Lock:
    """Makes a folder unwritable for this machine's user, for real, and writable again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.root = os.geteuid() == 0
        self.how = "chattr +i (root, whom modes do not stop)" if self.root else "chmod 555"

    def close(self) -> None:
        """Lock it, then prove it: a probe write must fail (or the scenario cannot run here)."""
        if self.root:
            subprocess.run(["chattr", "+i", str(self.folder)], check=True, capture_output=True)
        else:
            self.folder.chmod(0o555)
        probe = self.folder / "probe"
        try:
            probe.mkdir()
        except PermissionError:
            return
        probe.rmdir()
        self.open()
        pytest.skip(f"{self.how} did not stop writes to {self.folder} on this machine")

    def open(self) -> None:
        if self.root:
            subprocess.run(["chattr", "-i", str(self.folder)], check=True, capture_output=True)
        else:
            self.folder.chmod(0o755)


def test_an_unwritable_media_folder_fails_the_image_with_its_reason_and_retry_works(
    service_logs, private_redis, page, tmp_path
):
    media = tmp_path / "media"
    media.mkdir()
    lock = Lock(media)
    env = {"REDIS_URL": private_redis.url, "MEDIA_ROOT": str(media)}
    tokens = {"TANDEM_CHAT_MAX_NEW_TOKENS": "32", "TANDEM_CHAT_TEMPERATURE": "0"}
    server = start_daphne("daphne-media-ro", service_logs, **tokens, **env, **chaos.SERVER_ENV)
    worker = start_worker(service_logs, **env, **RENDER)
    try:
        wait_for_model(server)
        visitor = chaos.make_visitor("media-ro")
        conversation = visitor.conversation()
        page.context.add_cookies(visitor.browser_cookies(server))
        page.goto(f"{server.url}/c/{conversation.pk}/")
        chat = Chat(page, server.url, visitor.user)
        expect(page.locator("#connection")).to_have_attribute("data-connection", "open")

        lock.close()
        sent = time.monotonic()
        chat.send(PROMPT, image=True)
        text_id, image_id = chat.part_id(chat.text_part), chat.part_id(chat.image_part)
        chaos.wait_terminal([image_id, text_id], FAIL_BOUND, "the image to end")
        failed_after = time.monotonic() - sent
        failed = Part.objects.get(pk=image_id)
        text_before = Part.objects.get(pk=text_id)
        reason_shown = chat.image_part.locator(".failure-reason")
        expect(reason_shown).to_contain_text(REASON, timeout=15_000)
        shown_words = reason_shown.text_content()
        status_shown = chat.reply.get_attribute("data-status")
        files_while_locked = sorted(str(p.relative_to(media)) for p in media.rglob("*"))

        lock.open()
        retried = time.monotonic()
        chat.image_part.locator(".retry-image").click()
        chaos.wait_terminal([image_id], RETRY_BOUND, "the retried image to end")
        expect(chat.image_part).to_have_attribute("data-state", "succeeded", timeout=30_000)
        expect(chat.image_part.locator("img")).to_be_visible()
        retry_took = time.monotonic() - retried
        assert server.service.alive() and worker.service.alive()
    finally:
        lock.open()
        server.service.stop()
        worker.service.stop()
    worker_log = worker.service.log_path.read_text(errors="replace")
    web_log = server.service.log_path.read_text(errors="replace")

    after = Part.objects.get(pk=image_id)
    text_after = Part.objects.get(pk=text_id)
    stored = media / after.image.name if after.image else None
    figures = chaos.record_figures(
        "media_unwritable",
        f"MEDIA_ROOT unwritable ({lock.how}): the image {failed.state} "
        f'{failed_after:.1f} s after the turn with "{failed.error}", shown on the page; the '
        f"text {text_before.state} ({len(text_before.text)} characters, unchanged after); "
        f"writable again, Retry stored the picture in {retry_took:.1f} s (attempt "
        f"{after.attempt}, {stored.stat().st_size if stored else 0} bytes)",
        how=lock.how,
        image_state=failed.state,
        image_error=failed.error,
        reason_shown=shown_words,
        message_status_shown=status_shown,
        seconds_from_turn_to_failed=round(failed_after, 2),
        files_written_while_unwritable=files_while_locked,
        text={"state": text_before.state, "characters": len(text_before.text)},
        retry={
            "state": after.state,
            "attempt": after.attempt,
            "seconds": round(retry_took, 2),
            "bytes": stored.stat().st_size if stored else 0,
        },
        tracebacks={"web": web_log.count("Traceback"), "worker": worker_log.count("Traceback")},
    )
    assert failed.state == Part.State.FAILED, figures
    assert REASON in failed.error and "media folder" in failed.error, figures
    assert REASON in shown_words
    assert status_shown == "partial", figures
    assert files_while_locked == []
    assert text_before.state == Part.State.SUCCEEDED and text_before.text
    assert (text_after.state, text_after.text) == (text_before.state, text_before.text)
    assert after.state == Part.State.SUCCEEDED and after.attempt == failed.attempt + 1, figures
    assert stored is not None and stored.stat().st_size > 0
    assert figures["tracebacks"] == {"web": 0, "worker": 0}, figures
    assert re.search(rf"image part {image_id} failed: Failed: the picture", worker_log)
