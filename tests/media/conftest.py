"""Media fixtures: a reply with an image part, an isolated MEDIA_ROOT, an empty media queue."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat.models import Conversation, Message, Part
from chat.states import TERMINAL
from media.backends.base import prompt_seed
from media.backends.procedural import ProceduralBackend
from tests.support.media import Worker
from tests.support.processes import wait_until

PROMPT = "A lighthouse on a cliff at sunset, with seagulls"


@dataclass
class Turn:
    """One turn as the chat writes it: the user's words, then a reply with text and image."""

    conversation: Conversation
    reply: Message
    text: Part
    image: Part

    def refresh(self) -> Part:
        """The image part as it is in the database now."""
        return Part.objects.get(pk=self.image.pk)


def make_turn(prompt: str = PROMPT, text_state: str = Part.State.SUCCEEDED) -> Turn:
    owner, _ = get_user_model().objects.get_or_create(username="painter")
    conversation = Conversation.objects.create(owner=owner, title=prompt[:60])
    Message.objects.create(
        conversation=conversation,
        role=Message.Role.USER,
        position=0,
        text=prompt,
        wants_image=True,
    )
    reply = Message.objects.create(
        conversation=conversation, role=Message.Role.ASSISTANT, position=1, wants_image=True
    )
    text = Part.objects.create(
        message=reply, index=0, kind=Part.Kind.TEXT, state=text_state, text="Here it is."
    )
    image = Part.objects.create(
        message=reply, index=1, kind=Part.Kind.IMAGE, queued_at=timezone.now()
    )
    return Turn(conversation, reply, text, image)


def wait_image(turn: Turn, states: set[str], timeout: float = 60) -> Part:
    """Wait until the image part reaches one of `states`; return it."""
    wait_until(
        lambda: turn.refresh().state in states, timeout, f"the image part to be one of {states}"
    )
    return turn.refresh()


def stored_images(media_root: Path, part: Part) -> list[Path]:
    """The files the part's renders left under MEDIA_ROOT."""
    return sorted(media_root.glob(f"images/*/*/part-{part.pk}-*.png"))


# 12 steps of 0.25 s: long enough to act on a render in flight, even on a busy machine.
STEPS, STEP_DELAY = 12, 0.25
IMAGES = {"TANDEM_IMAGE_STEPS": str(STEPS), "TANDEM_IMAGE_STEP_DELAY": str(STEP_DELAY)}
FINAL = set(TERMINAL)
# Every try fails at once, and is retried once after 0.2 s: "Failed after 2 tries".
FAILING = {
    "TANDEM_IMAGE_FAILURE_RATE": "1",
    "TANDEM_IMAGE_MAX_RETRIES": "1",
    "TANDEM_IMAGE_RETRY_BACKOFF": "0.2",
}


def expected_png(prompt: str = PROMPT) -> bytes:
    return ProceduralBackend(STEPS, 0).render(
        prompt, seed=prompt_seed(prompt), on_progress=lambda _: None
    )


def finished_runs(worker: Worker, task_id: str) -> int:
    """How many deliveries of the task the worker has finished."""
    return worker.log_count(f"Task media.render_image[{task_id}] succeeded")


def terminal_states(states: list[dict]) -> list[str]:
    return [state["state"] for state in states if state["state"] in FINAL]


def wait_progress(turn: Turn, timeout: float = 30) -> None:
    wait_until(lambda: turn.refresh().progress > 0, timeout, "the render to make progress")


@pytest.fixture
def media_root(tmp_path, settings) -> Path:
    """A MEDIA_ROOT of this test's own, for this process (pass it to workers too)."""
    root = tmp_path / "media"
    root.mkdir()
    settings.MEDIA_ROOT = root
    return root


@pytest.fixture(autouse=True)
def empty_media_queue():
    """The shared test Redis's media queue starts and ends each media test empty, and so does
    this process's outbox (a test that enqueued while its broker was down leaves parts there,
    which the next test's images would queue behind)."""
    from config.celery import app
    from media.services import outbox

    app.control.purge()
    yield
    wait_until(lambda: not outbox.held(), 10, "the outbox to send or drop what it holds")
    app.control.purge()
