"""The Part service at the bottom of the chat: guarded moves, progress only while running."""

from __future__ import annotations

import pytest

from chat.models import Conversation, Message, Part
from chat.parts import part_progress, part_transition

pytestmark = pytest.mark.django_db(transaction=True)


def queued_part(conversation, kind: str = Part.Kind.TEXT) -> Part:
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    return Part.objects.create(message=reply, index=0, kind=kind)


def test_an_unknown_field_raises_and_changes_nothing(conversation):
    part = queued_part(conversation)
    with pytest.raises(ValueError, match="strem_owner"):
        part_transition(part.pk, Part.State.STREAMING, strem_owner="web-1")  # misspelt
    part.refresh_from_db()
    assert (part.state, part.stream_owner) == (Part.State.QUEUED, "")


def test_progress_is_saved_only_while_running(conversation: Conversation):
    part = queued_part(conversation, Part.Kind.IMAGE)
    assert not part_progress(part, 0.5)  # still queued
    part = part_transition(part.pk, Part.State.RUNNING)
    assert part_progress(part, 1.7)  # clamped
    assert Part.objects.get(pk=part.pk).progress == 1.0
