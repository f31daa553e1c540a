"""A conversation written out whole: as Markdown to read, as JSON to keep or process.

The JSON carries every part with its state, error, attempt and timings, so a reply that
finished partial (its text, not its image) says so, every version of a regenerated reply
(the one on screen first), and every branch of an edited message (the branch on screen is
`messages`; each edited user message lists its other `branches`, each the messages from there
on). The Markdown gives the branch and versions on screen, then the other branches of its
edited messages, and says in words what did not finish. Both are built from the saved rows,
so a reply still streaming is exported as far as it was saved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from chat import branches
from chat.models import Conversation, Message, Part
from chat.states import message_status

FORMAT_VERSION = 3  # 2: a reply's versions; 3: an edited message's branches


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


@dataclass(frozen=True)
class Tree:
    """A conversation's messages, every branch, and where each hangs."""

    children: dict[int | None, list[Message]]
    parents: dict[int, int | None]
    places: dict[int, tuple[int, int]]

    @classmethod
    def of(cls, conversation: Conversation) -> Tree:
        messages = branches.tree(conversation.pk)
        return cls(
            branches.children_of(messages), branches.parents(messages), branches.places(messages)
        )

    def shown(self) -> list[Message]:
        roots = self.children.get(None)
        return branches.path_from(branches.chosen(roots), self.children) if roots else []

    def others(self, message: Message) -> list[Message]:
        """The other branches at `message`: its siblings, oldest first."""
        siblings = self.children[self.parents[message.pk]]
        return [sibling for sibling in siblings if sibling.pk != message.pk]


def branch_records(tree: Tree, start: Message) -> list[dict]:
    """The messages of the branch that starts at `start`, as it was last shown."""
    path = branches.path_from(start, tree.children)
    return [message_record(tree, m, forks=n > 0) for n, m in enumerate(path)]


def message_record(tree: Tree, message: Message, forks: bool = True) -> dict:
    """A user message with its other branches (unless `forks` is False: the caller lists
    them), or a reply with the version on screen and every version it has had."""
    record = {
        "position": message.position,
        "role": message.role,
        "created_at": moment(message.created_at),
    }
    if message.role == Message.Role.USER:
        branch, count = tree.places[message.pk]
        record |= {
            "text": message.text,
            "wants_image": message.wants_image,
            "branch": branch,
            "branch_count": count,
        }
        if forks and count > 1:
            record["branches"] = [
                {"branch": tree.places[other.pk][0], "messages": branch_records(tree, other)}
                for other in tree.others(message)
            ]
        return record
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


def as_json(conversation: Conversation) -> str:
    tree = Tree.of(conversation)
    document = {
        "format": "tandem.conversation",
        "format_version": FORMAT_VERSION,
        "id": conversation.pk,
        "title": conversation.title,
        "created_at": moment(conversation.created_at),
        "updated_at": moment(conversation.updated_at),
        "messages": [message_record(tree, message) for message in tree.shown()],
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


def message_markdown(tree: Tree, message: Message, level: str) -> str:
    """One message under a heading of `level` ("##"), saying what did not finish."""
    notes = []
    if message.role == Message.Role.USER:
        if message.wants_image:
            notes.append("asked for an image")
        branch, count = tree.places[message.pk]
        if count > 1:
            notes.append(f"branch {branch} of {count}")
        label = f" ({', '.join(notes)})" if notes else ""
        return f"{level} You{label}\n\n{message.text}"
    parts = message.shown_parts()
    status = message_status([part.state for part in parts])
    if status != Message.Status.COMPLETE:
        notes.append(status.replace("_", " "))
    if message.version_count() > 1:
        notes.append(f"version {message.shown_version} of {message.version_count()}")
    label = f" ({', '.join(notes)})" if notes else ""
    body = [text for text in (part_markdown(part) for part in parts) if text]
    return f"{level} Tandem{label}\n\n" + "\n\n".join(body)


def as_markdown(conversation: Conversation) -> str:
    """The branch on screen, then the other branches of each of its edited messages."""
    tree = Tree.of(conversation)
    shown = tree.shown()
    blocks = [f"# {conversation.title or 'Untitled conversation'}"]
    blocks += [message_markdown(tree, message, "##") for message in shown]
    forks = [m for m in shown if m.role == Message.Role.USER and tree.places[m.pk][1] > 1]
    if forks:
        blocks.append("---\n\n## Other branches")
    for message in forks:
        for other in tree.others(message):
            branch, count = tree.places[other.pk]
            blocks.append(f"### Branch {branch} of {count} at message {message.position + 1}")
            blocks += [
                message_markdown(tree, m, "####") for m in branches.path_from(other, tree.children)
            ]
    return "\n\n".join(blocks) + "\n"
