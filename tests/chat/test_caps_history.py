"""The per-user cap counts the replies in flight without reading the user's history.

On PostgreSQL (run with DATABASE_URL=postgres://…; skipped on SQLite): a user with 400
finished conversations and one reply in progress. Every statement `caps.replies_in_flight`
runs is EXPLAINed: the parts are read through the partial index of those in flight, chat_message
and chat_conversation only by their primary keys, none of the three scanned whole. (Their
buffers are not bounded here: on a server with autovacuum off, as this one, the partial index
keeps the entries of rows other tests wrote and rolled back, and a bitmap scan reads their
pages.) The count it replaces joined the user's conversations, messages and parts
and so read every reply the user ever had; on tables never analyzed (the soak's server runs
with autovacuum off) the planner turned it, past ~10,000 turns, into a scan of every
assistant message against every conversation of the user: 0.2-0.7 s per call, twice per
turn (docs/reliability.md, "The late slowdown").
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat import caps
from chat.models import UNFINISHED_STATES, Conversation, Message, Part
from chat.states import TERMINAL

CONVERSATIONS = 400
TURNS = 4


def history(owner, conversations: int) -> None:
    """`conversations` finished conversations of `TURNS` turns, every other reply with an image."""
    made = Conversation.objects.bulk_create(
        Conversation(owner=owner, title=f"old {i}") for i in range(conversations)
    )
    messages = []
    for conversation in made:
        for turn in range(TURNS):
            for role in (Message.Role.USER, Message.Role.ASSISTANT):
                messages.append(
                    Message(
                        conversation=conversation,
                        role=role,
                        position=2 * turn + (role == Message.Role.ASSISTANT),
                        text="Write two sentences about the sea." if role == "user" else "",
                        wants_image=turn % 2 == 0,
                    )
                )
    Message.objects.bulk_create(messages)
    parts = []
    for reply in messages:
        if reply.role != Message.Role.ASSISTANT:
            continue
        parts.append(
            Part(message=reply, index=0, kind=Part.Kind.TEXT, state="succeeded", text="x" * 150)
        )
        if reply.wants_image:
            parts.append(Part(message=reply, index=1, kind=Part.Kind.IMAGE, state="succeeded"))
    Part.objects.bulk_create(parts)


def reply_in_progress(owner) -> Message:
    conversation = Conversation.objects.create(owner=owner, title="now")
    Message.objects.create(conversation=conversation, role="user", position=0, text="Hi")
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    Part.objects.create(message=reply, index=0, kind=Part.Kind.TEXT, state="streaming")
    Part.objects.create(message=reply, index=1, kind=Part.Kind.IMAGE, state="queued")
    return reply


def plans(queries: list[dict]) -> list[dict]:
    """Each statement's executed plan, with its buffers."""
    found = []
    for query in queries:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query["sql"])
            found.append(cursor.fetchone()[0][0]["Plan"])
    return found


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def ways_read(scans: list[dict], table: str) -> set[str]:
    """How the plans read `table`: the index of each scan of it (a bitmap scan's from its
    child), or the node's type when it used none."""
    ways = set()
    for node in scans:
        if node.get("Relation Name") != table:
            continue
        if node["Node Type"] == "Bitmap Heap Scan":
            ways |= {child["Index Name"] for child in nodes(node) if "Index Name" in child}
        else:
            ways.add(node.get("Index Name", node["Node Type"]))
    return ways


def test_the_unfinished_states_are_every_state_but_the_final_ones():
    assert set(UNFINISHED_STATES) == set(Part.State.values) - TERMINAL


@pytest.mark.django_db
def test_the_count_reads_the_replies_in_flight_not_the_history(alice, bob):
    if connection.vendor != "postgresql":
        pytest.skip("the plans checked are PostgreSQL's; this run is on " + connection.vendor)
    history(alice, CONVERSATIONS)
    history(bob, CONVERSATIONS // 4)
    # Conversations of a two-hour soak's size (a new one every fourth turn): on a table of a
    # few pages a scan of it is cheaper than its primary key, and a fair plan.
    Conversation.objects.bulk_create(Conversation(owner=bob, title="empty") for _ in range(3000))
    reply_in_progress(alice)
    reply_in_progress(bob)

    with CaptureQueriesContext(connection) as captured:
        assert caps.replies_in_flight(alice.pk) == 1
    executed = plans(captured.captured_queries)

    scans = [node for plan in executed for node in nodes(plan)]
    assert ways_read(scans, "chat_part") == {"part_unfinished"}
    assert ways_read(scans, "chat_message") <= {"chat_message_pkey"}
    assert ways_read(scans, "chat_conversation") <= {"chat_conversation_pkey"}
    seq_scans = [n["Relation Name"] for n in scans if n["Node Type"] == "Seq Scan"]
    assert not {"chat_message", "chat_part", "chat_conversation"} & set(seq_scans), seq_scans
