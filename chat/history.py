"""The prompt of a turn: the conversation's system prompt and the conversation so far (the
reply's own branch, each earlier reply's version on screen), through the model's chat template.

When the whole history does not fit the context window (less room for the reply), the
oldest turns are dropped, whole, until it does; the caller records that it happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from chat import branches
from chat.models import Message, Part


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    truncated: bool


def transcript(message: Message) -> list[dict]:
    """`message` and the messages before it on its branch: the user's words and the saved
    text of each reply (its version on screen), oldest first."""
    turns = []
    for said in branches.lineage(message):
        if said.role == Message.Role.USER:
            turns.append({"role": "user", "content": said.text})
            continue
        text = "".join(p.text for p in said.shown_parts() if p.kind == Part.Kind.TEXT)
        if text:
            turns.append({"role": "assistant", "content": text})
    return turns


def user_words(reply: Message) -> str:
    """The user's words that `reply` answers (its parent); an image's prompt."""
    if reply.parent_id is not None:
        asked = Message.objects.filter(pk=reply.parent_id).first()
    else:  # a reply saved without a parent follows the message one position up
        asked = Message.objects.filter(
            conversation_id=reply.conversation_id, position=reply.position - 1
        ).first()
    return asked.text if asked else ""


def system_message(system_prompt: str) -> list[dict]:
    """The conversation's system prompt as the first chat message; none when it is empty."""
    return [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []


def messages(message: Message, system_prompt: str) -> list[dict]:
    """The whole prompt of the reply `message` as chat messages, for a remote engine (its
    server applies the template and refuses what its context cannot hold)."""
    return system_message(system_prompt) + transcript(message)


def build(tokenizer, message: Message, budget: int, system_prompt: str) -> Prompt:
    """Prompt ids within `budget` tokens, dropping the oldest turns first (never the last).

    `system_prompt` (the conversation's own; empty sends none) always stays.
    """
    # Imported here: it loads transformers, which Celery workers (they read user_words) never need.
    from inference.provisioning.prompting import chat_prompt_ids

    turns = transcript(message)
    system = system_message(system_prompt)
    dropped = 0
    while True:
        ids = chat_prompt_ids(tokenizer, system + turns[dropped:])
        if len(ids) <= budget or dropped >= len(turns) - 1:
            return Prompt(ids[-budget:], truncated=dropped > 0 or len(ids) > budget)
        dropped += 1
