"""A conversation written out whole: as Markdown to read, as JSON to keep or process.

The JSON carries every part with its state, error, attempt and timings, so a reply that
finished partial (its text, not its image) says so, and every version of a regenerated reply
(the one on screen first); the Markdown gives the versions on screen and says in words what
did not finish. Both are
built from the saved rows, so a reply still streaming is exported as far as it was saved.
"""

from __future__ import annotations

import json

from django.db.models import Prefetch

from chat.models import Conversation, Message, Part
from chat.states import message_status

FORMAT_VERSION = 2  # 2: a reply's versions


def moment(value) -> str | None:
    return value.isoformat() if value else None


def part_record(part: Part) -> dict:
    return {
        "index": part.index,
        "kind": part.kind,
        "state": part.state,
        "text": part.text if part.kind == Part.Kind.TEXT else None,
        "image_url": part.image.url if part.image else None,
        "previous_image_url": part.previous_image.url if part.previous_image else None,
        "error": part.error,
        "attempt": part.attempt,
        "finish_reason": part.finish_reason,
        "prompt_tokens": part.prompt_tokens,
        "completion_tokens": part.completion_tokens,
        "queued_at": moment(part.queued_at),
        "started_at": moment(part.started_at),
        "finished_at": moment(part.finished_at),
    }


def message_record(message: Message) -> dict:
    """A user message, or a reply with the version on screen and every version it has had."""
    record = {
        "position": message.position,
        "role": message.role,
        "created_at": moment(message.created_at),
    }
    if message.role == Message.Role.USER:
        return record | {"text": message.text, "wants_image": message.wants_image}
    versions: dict[int, list[Part]] = {}
    for part in message.parts.all():
        versions.setdefault(part.version, []).append(part)
    shown = message.shown_parts()
    return record | {
        "status": message_status([part.state for part in shown]),
        "history_truncated": message.history_truncated,
        "version": message.shown_version,
        "parts": [part_record(part) for part in shown],
        "versions": [
            {
                "version": version,
                "status": message_status([part.state for part in parts]),
                "parts": [part_record(part) for part in parts],
            }
            for version, parts in sorted(versions.items())
        ],
    }


def messages_of(conversation: Conversation) -> list[Message]:
    ordered_parts = Prefetch("parts", queryset=Part.objects.order_by("version", "index"))
    return list(conversation.messages.order_by("position").prefetch_related(ordered_parts))


def as_json(conversation: Conversation) -> str:
    document = {
        "format": "tandem.conversation",
        "format_version": FORMAT_VERSION,
        "id": conversation.pk,
        "title": conversation.title,
        "created_at": moment(conversation.created_at),
        "updated_at": moment(conversation.updated_at),
        "messages": [message_record(message) for message in messages_of(conversation)],
    }
    return json.dumps(document, ensure_ascii=False, indent=2)


IMAGE_WORDS = {
    Part.State.QUEUED: "_(image still waiting)_",
    Part.State.RUNNING: "_(image still being drawn)_",
    Part.State.CANCELLED: "_(image stopped)_",
    Part.State.INTERRUPTED: "_(image interrupted)_",
}
TEXT_WORDS = {
    Part.State.QUEUED: "_(text still waiting)_",
    Part.State.STREAMING: "_(text still being written)_",
    Part.State.CANCELLED: "_(stopped)_",
    Part.State.INTERRUPTED: "_(interrupted: the server restarted)_",
}


def part_markdown(part: Part) -> str:
    if part.kind == Part.Kind.IMAGE:
        if part.state == Part.State.SUCCEEDED and part.image:
            return f"![The generated image]({part.image.url})"
        if part.state == Part.State.FAILED:
            return f"_(image failed: {part.error or 'unknown error'})_"
        return IMAGE_WORDS.get(part.state, "")
    lines = [part.text] if part.text else []
    if part.state == Part.State.FAILED:
        lines.append(f"_(text failed: {part.error or 'unknown error'})_")
    elif part.state in TEXT_WORDS:
        lines.append(TEXT_WORDS[part.state])
    return "\n\n".join(lines)


def as_markdown(conversation: Conversation) -> str:
    blocks = [f"# {conversation.title or 'Untitled conversation'}"]
    for message in messages_of(conversation):
        if message.role == Message.Role.USER:
            asked = " (asked for an image)" if message.wants_image else ""
            blocks.append(f"## You{asked}\n\n{message.text}")
            continue
        parts = message.shown_parts()
        status = message_status([part.state for part in parts])
        notes = [] if status == Message.Status.COMPLETE else [status.replace("_", " ")]
        if message.version_count() > 1:
            notes.append(f"version {message.shown_version} of {message.version_count()}")
        label = f" ({', '.join(notes)})" if notes else ""
        body = [text for text in (part_markdown(part) for part in parts) if text]
        blocks.append(f"## Tandem{label}\n\n" + "\n\n".join(body))
    return "\n\n".join(blocks) + "\n"
