"""A conversation as a whole: rename it, change its settings, delete it (with its work).

Only views and the admin call these. Each change is saved and then told to the
conversation's browsers (`conversation.state`, `conversation.deleted`), so another tab on
the same conversation follows it.
"""

from __future__ import annotations

import logging
from copy import copy

from django import forms
from django.db import transaction
from django.forms.models import model_to_dict

from chat import events, live_text, services
from chat.models import (
    MAX_NEW_TOKENS_CAP,
    SETTING_DEFAULTS,
    SYSTEM_PROMPT_CHARS,
    UNFINISHED_STATES,
    Conversation,
    Message,
    Part,
)

log = logging.getLogger(__name__)


class ConversationInvalid(Exception):
    """A change refused for its input; `errors` maps each field to what is wrong with it."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {text}" for field, text in errors.items()))
        self.errors = errors


def conversation_state_event(conversation: Conversation) -> dict:
    return {"type": "conversation.state", "conversation": conversation_fields(conversation)}


def conversation_fields(conversation: Conversation) -> dict:
    """What a page shows of a conversation besides its messages."""
    return {
        "id": conversation.pk,
        "title": conversation.title,
        "settings": conversation.effective_settings(),
    }


SETTINGS_FIELDS = list(SETTING_DEFAULTS)


def between(low, high, what: str) -> dict[str, str]:
    text = f"{what} must be between {low} and {high}."
    return {"min_value": text, "max_value": text, "invalid": f"{what} must be a number."}


class SettingsForm(forms.ModelForm):
    """A conversation's settings, checked by its fields' validators, in words a person reads."""

    class Meta:
        model = Conversation
        fields = SETTINGS_FIELDS
        error_messages = {
            "temperature": between(0, 2, "Temperature"),
            "top_p": between(0.05, 1, "Top-p"),
            "max_new_tokens": between(1, MAX_NEW_TOKENS_CAP, "Max new tokens")
            | {"invalid": "Max new tokens must be a whole number."},
            "system_prompt": {
                "max_length": f"The system prompt is limited to {SYSTEM_PROMPT_CHARS:,} characters."
            },
        }


def valid_settings(data: dict, conversation: Conversation | None = None) -> dict:
    """`data` over the conversation's own settings, validated; fields not given keep their
    value, and an empty one goes back to following its default. Raises ConversationInvalid
    naming each bad field."""
    current = model_to_dict(conversation or Conversation(), fields=SETTINGS_FIELDS)
    given = {name: value for name, value in data.items() if name in SETTINGS_FIELDS}
    unknown = sorted(set(data) - set(SETTINGS_FIELDS))
    if unknown:
        raise ConversationInvalid({name: "Not a setting." for name in unknown})
    # The form writes the values onto its instance even when they are refused: give it a copy.
    form = SettingsForm({**current, **given}, instance=copy(conversation))
    if not form.is_valid():
        raise ConversationInvalid({name: errors[0] for name, errors in form.errors.items()})
    return {name: form.cleaned_data[name] for name in SETTINGS_FIELDS}


def conversation_settings_update(conversation: Conversation, data: dict) -> Conversation:
    """Change the conversation's settings; the next reply uses them, open pages are told."""
    values = valid_settings(data, conversation)
    with transaction.atomic():
        Conversation.objects.filter(pk=conversation.pk).update(**values)
        for name, value in values.items():
            setattr(conversation, name, value)
        event = conversation_state_event(conversation)
        transaction.on_commit(lambda: events.send(conversation.pk, event))
    return conversation


def conversation_rename(conversation: Conversation, title: str) -> Conversation:
    """Give the conversation a new title (surrounding spaces dropped, never empty)."""
    title = " ".join(title.split())
    limit = Conversation._meta.get_field("title").max_length
    if not title:
        raise ConversationInvalid({"title": "A title cannot be empty."})
    if len(title) > limit:
        raise ConversationInvalid(
            {"title": f"That title is {len(title)} characters; the limit is {limit}."}
        )
    with transaction.atomic():
        Conversation.objects.filter(pk=conversation.pk).update(title=title)
        conversation.title = title
        event = conversation_state_event(conversation)
        transaction.on_commit(lambda: events.send(conversation.pk, event))
    return conversation


def conversation_delete(conversation: Conversation) -> int:
    """Delete a conversation, stopping the work still running for it; returns parts stopped.

    Every reply still in progress is stopped as the stop button does (the text cancelled in
    this process's engine, a queued or running image cancelled, so its worker stops at its
    next progress report and a render that finishes anyway is refused and deletes its file).
    Once that is committed the rows go, then the image files and the live text tails, and
    the conversation's browsers are told (`conversation.deleted`); every URL of it is 404
    from then on. A text streaming in another web process cannot be reached from here: its
    engine finishes the request and the writer's saves find no row.
    """
    replies = Message.objects.filter(
        conversation=conversation, role=Message.Role.ASSISTANT, parts__state__in=UNFINISHED_STATES
    ).distinct()
    stopped = 0
    for reply in replies:
        stopped += reply.parts.filter(state__in=UNFINISHED_STATES).count()
        services.message_stop(reply)
    conversation_id = conversation.pk
    # After commit: inside a caller's transaction (the admin's delete view) the stops above
    # are announced only then, and they need the rows to say which conversation to tell.
    transaction.on_commit(lambda: remove(conversation_id))
    log.info("conversation %s: %s unfinished parts stopped", conversation_id, stopped)
    return stopped


def remove(conversation_id: int) -> None:
    """The rows, then their image files and live tails; then the open pages are told."""
    parts = Part.objects.filter(message__conversation_id=conversation_id)
    files = [name for pair in parts.values_list("image", "previous_image") for name in pair if name]
    text_parts = list(parts.filter(kind=Part.Kind.TEXT).values_list("pk", flat=True))
    Conversation.objects.filter(pk=conversation_id).delete()
    storage = Part._meta.get_field("image").storage
    for name in files:
        storage.delete(name)
    from chat import text_stream  # the writer imports the engine (torch): web processes only

    text_stream.writer.forget(text_parts)
    for part_id in text_parts:
        live_text.expire(part_id)
    events.send(conversation_id, {"type": "conversation.deleted", "id": conversation_id})
    log.info("conversation %s deleted with %s image files", conversation_id, len(files))
