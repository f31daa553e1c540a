"""The derived message status and the part state machines."""

import pytest

from chat.models import Message, Part
from chat.states import can_transition, message_status

S = Part.State


@pytest.mark.parametrize(
    "states, status",
    [
        ([S.QUEUED], Message.Status.IN_PROGRESS),
        ([S.SUCCEEDED, S.RUNNING], Message.Status.IN_PROGRESS),
        ([S.SUCCEEDED, S.SUCCEEDED], Message.Status.COMPLETE),
        ([S.SUCCEEDED], Message.Status.COMPLETE),
        ([S.SUCCEEDED, S.FAILED], Message.Status.PARTIAL),
        ([S.CANCELLED, S.SUCCEEDED], Message.Status.PARTIAL),
        ([S.INTERRUPTED, S.SUCCEEDED], Message.Status.PARTIAL),
        ([S.FAILED, S.FAILED], Message.Status.FAILED),
        ([S.INTERRUPTED], Message.Status.FAILED),
    ],
)
def test_message_status_is_derived(states, status):
    assert message_status(states) == status


def test_text_and_image_machines():
    assert can_transition("text", S.QUEUED, S.STREAMING)
    assert can_transition("text", S.STREAMING, S.INTERRUPTED)
    assert not can_transition("text", S.SUCCEEDED, S.STREAMING)
    assert not can_transition("text", S.FAILED, S.QUEUED)  # text is never retried
    assert can_transition("image", S.FAILED, S.QUEUED)
    assert can_transition("image", S.RUNNING, S.RUNNING)
    assert not can_transition("image", S.SUCCEEDED, S.FAILED)
    assert can_transition("image", S.SUCCEEDED, S.QUEUED)  # "New image"
    assert not can_transition("text", S.SUCCEEDED, S.QUEUED)
    assert not can_transition("image", S.QUEUED, S.STREAMING)
