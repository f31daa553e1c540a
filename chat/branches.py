"""A conversation's tree of messages and the branch of it on screen.

Editing a user message adds a sibling (same parent, same position) instead of changing it, so
the old branch and everything after it stay. Of a set of siblings, the one `shown` is on
screen; following the shown message at each fork from the first one gives the conversation
as the page draws it. The model's history of a reply is the reply's own ancestors.
"""

from __future__ import annotations

from django.db.models import Prefetch

from chat.models import Message, Part


def tree(conversation_id: int) -> list[Message]:
    """Every message of the conversation, every branch, with their parts, oldest first."""
    ordered_parts = Prefetch("parts", queryset=Part.objects.order_by("version", "index"))
    return list(
        Message.objects.filter(conversation_id=conversation_id)
        .order_by("position", "pk")
        .prefetch_related(ordered_parts)
    )


def parents(messages: list[Message]) -> dict[int, int | None]:
    """Each message's parent id (None for a first message).

    A message saved without a parent past position 0 (written directly, as fixtures do)
    follows the oldest message one position up: a conversation never edited is one branch.
    """
    oldest_at: dict[int, int] = {}
    for message in sorted(messages, key=lambda m: m.pk, reverse=True):
        oldest_at[message.position] = message.pk
    return {
        m.pk: m.parent_id if m.parent_id or not m.position else oldest_at.get(m.position - 1)
        for m in messages
    }


def children_of(messages: list[Message]) -> dict[int | None, list[Message]]:
    """Each message's children (None: the first messages), oldest first."""
    parent = parents(messages)
    children: dict[int | None, list[Message]] = {}
    for message in sorted(messages, key=lambda m: m.pk):
        children.setdefault(parent[message.pk], []).append(message)
    return children


def chosen(siblings: list[Message]) -> Message:
    """The sibling on screen (the newest, should none be marked)."""
    return next((m for m in siblings if m.shown), siblings[-1])


def path_from(start: Message, children: dict[int | None, list[Message]]) -> list[Message]:
    """`start` and the messages after it, following the shown one at every fork."""
    path = [start]
    while children.get(path[-1].pk):
        path.append(chosen(children[path[-1].pk]))
    return path


def shown_path(messages: list[Message]) -> list[Message]:
    """The branch on screen, oldest first."""
    children = children_of(messages)
    return path_from(chosen(children[None]), children) if children.get(None) else []


def places(messages: list[Message]) -> dict[int, tuple[int, int]]:
    """For every message: (its branch number among its siblings, how many there are)."""
    found = {}
    for siblings in children_of(messages).values():
        for number, message in enumerate(siblings, start=1):
            found[message.pk] = (number, len(siblings))
    return found


def fork(message: Message) -> tuple[int | None, list[int]]:
    """Where `message` hangs: its parent's id and the ids of its siblings (itself among
    them, its edits), oldest first."""
    messages = list(Message.objects.filter(conversation_id=message.conversation_id))
    parent = parents(messages)
    mine = parent[message.pk]
    return mine, sorted(m.pk for m in messages if parent[m.pk] == mine)


def place(message: Message) -> tuple[int, int]:
    """One message's (branch number, branches) from the database."""
    siblings = fork(message)[1]
    return siblings.index(message.pk) + 1, len(siblings)


def lineage(message: Message) -> list[Message]:
    """`message` and its ancestors, oldest first, their parts prefetched."""
    messages = tree(message.conversation_id)
    by_id = {m.pk: m for m in messages}
    parent = parents(messages)
    line = [by_id[message.pk]]
    while parent[line[-1].pk] is not None:
        line.append(by_id[parent[line[-1].pk]])
    return line[::-1]


def leaf(conversation_id: int) -> Message | None:
    """The last message on screen: where the next turn goes."""
    path = shown_path(list(Message.objects.filter(conversation_id=conversation_id)))
    return path[-1] if path else None
