"""The part state machines: which transitions a service may make, and which states are final."""

from __future__ import annotations

from chat.models import Message, Part

S = Part.State
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.INTERRUPTED})
TROUBLE = frozenset({S.FAILED, S.CANCELLED, S.INTERRUPTED})

ALLOWED: dict[str, dict[str, frozenset[str]]] = {
    Part.Kind.TEXT: {
        S.QUEUED: frozenset({S.STREAMING, S.FAILED, S.CANCELLED, S.INTERRUPTED}),
        S.STREAMING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.INTERRUPTED}),
    },
    Part.Kind.IMAGE: {
        S.QUEUED: frozenset({S.RUNNING, S.FAILED, S.CANCELLED}),
        # running → running: a task redelivered after its worker died starts over.
        S.RUNNING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
        # retry: a failed or cancelled image goes back to the queue; "New image": a succeeded
        # one does too, its picture kept as `previous_image` until the new one succeeds.
        S.FAILED: frozenset({S.QUEUED}),
        S.CANCELLED: frozenset({S.QUEUED}),
        S.SUCCEEDED: frozenset({S.QUEUED}),
    },
}


def can_transition(kind: str, current: str, target: str) -> bool:
    """Whether a part of `kind` may move from `current` to `target`."""
    return target in ALLOWED[kind].get(current, frozenset())


def message_status(states: list[str]) -> str:
    """A message's status from its parts' states (never stored, always derived).

    in_progress while any part is not final; complete when all succeeded; partial when one
    succeeded and another failed, was cancelled or interrupted; failed when none succeeded.
    """
    if not states or any(state not in TERMINAL for state in states):
        return Message.Status.IN_PROGRESS
    succeeded = sum(state == S.SUCCEEDED for state in states)
    if succeeded == len(states):
        return Message.Status.COMPLETE
    return Message.Status.PARTIAL if succeeded else Message.Status.FAILED
