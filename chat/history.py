"""The prompt of a turn: the conversation's system prompt and the conversation so far, through
the model's chat template.

When the whole history does not fit the context window (less room for the reply), the
oldest turns are dropped, whole, until it does; the caller records that it happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from chat.models import Message, Part


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    truncated: bool


def transcript(conversation_id: int, up_to_position: int) -> list[dict]:
    """User messages and the saved text of assistant replies (the versions on screen),
    oldest first."""
    messages = (
        Message.objects.filter(conversation_id=conversation_id, position__lte=up_to_position)
        .prefetch_related("parts")
        .order_by("position")
    )
    turns = []
    for message in messages:
        if message.role == Message.Role.USER:
            turns.append({"role": "user", "content": message.text})
            continue
        text = "".join(p.text for p in message.shown_parts() if p.kind == Part.Kind.TEXT)
        if text:
            turns.append({"role": "assistant", "content": text})
    return turns


def user_words(reply: Message) -> str:
    """The user's words that `reply` answers (the message just before it); an image's prompt."""
    asked = Message.objects.filter(
        conversation_id=reply.conversation_id, position=reply.position - 1
    ).first()
    return asked.text if asked else ""


def system_message(system_prompt: str) -> list[dict]:
    """The conversation's system prompt as the first chat message; none when it is empty."""
    return [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []


def messages(conversation_id: int, up_to_position: int, system_prompt: str) -> list[dict]:
    """The whole prompt as chat messages, for a remote engine (its server applies the
    template and refuses what its context cannot hold)."""
    return system_message(system_prompt) + transcript(conversation_id, up_to_position)


def build(
    tokenizer, conversation_id: int, up_to_position: int, budget: int, system_prompt: str
) -> Prompt:
    """Prompt ids within `budget` tokens, dropping the oldest turns first (never the last).

    `system_prompt` (the conversation's own; empty sends none) always stays.
    """
    # Imported here: it loads transformers, which Celery workers (they read user_words) never need.
    from inference.provisioning.prompting import chat_prompt_ids

    turns = transcript(conversation_id, up_to_position)
    system = system_message(system_prompt)
    dropped = 0
    while True:
        ids = chat_prompt_ids(tokenizer, system + turns[dropped:])
        if len(ids) <= budget or dropped >= len(turns) - 1:
            return Prompt(ids[-budget:], truncated=dropped > 0 or len(ids) > budget)
        dropped += 1
