"""The conversation consumer on real Redis pub/sub (WebsocketCommunicator): the snapshot, the
live events, deltas with seq ranges, a forced gap mended from the live tail, and readers that
fall behind dropped to resume without holding up the others."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from chat import events, fanout, live_text, services
from chat.consumers import RESUME
from chat.models import Conversation, Message, Part
from chat.parts import part_transition
from chat.routing import websocket_urlpatterns

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

app = URLRouter(websocket_urlpatterns)


def streaming_reply(conversation, saved: str, saved_seq: int, tail: list[str]) -> Part:
    """A reply mid-stream: `saved` in the database at `saved_seq`, later pieces only in Redis."""
    Message.objects.create(conversation=conversation, role="user", position=0, text="Hi")
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    part = Part.objects.create(
        message=reply, index=0, kind="text", state="streaming", text=saved, seq=saved_seq
    )
    live_text.reset(part.pk)
    for piece in ["x"] * saved_seq + tail:
        live_text.append(part.pk, piece)
    return part


async def connect(user, conversation_id: int) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(app, f"/ws/conversations/{conversation_id}/")
    communicator.scope["user"] = user
    connected, code = await communicator.connect(timeout=10)
    assert connected, code
    return communicator


async def test_snapshot_includes_the_live_tail_then_dedupes(alice, conversation):
    part = await sync_to_async(streaming_reply)(conversation, "Hello", 2, [" wor", "ld"])
    ws = await connect(alice, conversation.pk)
    snapshot = await ws.receive_json_from(timeout=10)
    assert snapshot["type"] == "snapshot"
    [_, reply] = snapshot["messages"]
    [text] = reply["parts"]
    assert (text["text"], text["seq"]) == ("Hello world", 4)

    send = sync_to_async(events.send)
    ids = part.pk, part.message_id
    await send(conversation.pk, events.delta_event(*ids, 4, "ld"))  # already in the snapshot
    await send(conversation.pk, events.delta_event(*ids, 5, "!"))
    delta = await ws.receive_json_from(timeout=10)
    assert (delta["type"], delta["first"], delta["seq"], delta["text"]) == ("part.delta", 5, 5, "!")
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_forced_gap_is_mended_from_the_live_tail(alice, conversation):
    """Pieces 5 and 6 reach the tail but their delta is lost on the way (never published);
    the reader sees the next delta start at 7, fetches 5..6 from the tail and sends one delta
    of 5..7 in its place: the page gets every piece once, in order. A gap the tail cannot
    mend (pieces that were never recorded) makes the socket close for a resume instead."""
    part = await sync_to_async(streaming_reply)(conversation, "Hello", 2, [" wor", "ld"])
    ws = await connect(alice, conversation.pk)
    await ws.receive_json_from(timeout=10)
    ids = part.pk, part.message_id
    await sync_to_async(live_text.append)(part.pk, "!", "?", ".")
    send = sync_to_async(events.send)
    await send(conversation.pk, events.delta_event(*ids, 7, ".", first=7))  # 5..6 never sent
    mended = await ws.receive_json_from(timeout=10)
    assert (mended["first"], mended["seq"], mended["text"]) == (5, 7, "!?.")
    await send(conversation.pk, events.delta_event(*ids, 9, ":)", first=8))
    assert await ws.receive_json_from(timeout=10) == {**events.delta_event(*ids, 9, ":)", first=8)}
    await send(conversation.pk, events.delta_event(*ids, 12, "~", first=12))  # 10..11: nowhere
    closed = await ws.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": RESUME}


async def test_a_reader_that_falls_behind_is_dropped_and_the_others_keep_up(
    conversation, monkeypatch
):
    monkeypatch.setattr(fanout, "LIMIT", 5)
    hub = fanout.hub()
    slow, quick = await hub.join(conversation.pk), await hub.join(conversation.pk)
    send = sync_to_async(events.send)
    for n in range(1, 11):
        await send(conversation.pk, {"type": "message.state", "message_id": n, "status": "x"})
        delivery = await asyncio.wait_for(quick.next(), 10)
        assert delivery.event["message_id"] == n
    assert await asyncio.wait_for(slow.next(), 10) is None
    assert slow.lost == "fell 5 events behind"
    slow.close()
    quick.close()


async def test_part_and_message_state_reach_the_socket(alice, conversation):
    part = await sync_to_async(streaming_reply)(conversation, "", 0, [])
    ws = await connect(alice, conversation.pk)
    await ws.receive_json_from(timeout=10)
    await sync_to_async(part_transition)(part.pk, Part.State.SUCCEEDED, text="Done", seq=1)
    state = await ws.receive_json_from(timeout=10)
    assert state["type"] == "part.state" and state["part"]["state"] == "succeeded"
    status = await ws.receive_json_from(timeout=10)
    assert status == {"type": "message.state", "message_id": part.message_id, "status": "complete"}
    await ws.disconnect()


async def test_other_users_and_anonymous_are_refused(alice, bob, conversation):
    from django.contrib.auth.models import AnonymousUser

    for user, code in ((bob, 4404), (AnonymousUser(), 4401)):
        communicator = WebsocketCommunicator(app, f"/ws/conversations/{conversation.pk}/")
        communicator.scope["user"] = user
        connected, _ = await communicator.connect(timeout=10)
        assert connected  # accepted only to deliver the close code to the browser
        closed = await communicator.receive_output(timeout=10)
        assert closed == {"type": "websocket.close", "code": code}


async def test_malformed_frames_get_error_events(alice, conversation):
    ws = await connect(alice, conversation.pk)
    await ws.receive_json_from(timeout=10)
    await ws.send_to(text_data="{not json")
    assert (await ws.receive_json_from(timeout=10))["type"] == "error"
    await ws.send_to(text_data='{"type": "ping"}')
    assert (await ws.receive_json_from(timeout=10)) == {"type": "pong"}
    await ws.disconnect()


async def test_another_branch_shown_reaches_the_socket_and_counts_as_seen(alice, conversation):
    """`conversation.branch` carries the branch now on screen; its text is not sent again."""
    part = await sync_to_async(streaming_reply)(conversation, "Hello", 2, [])
    ws = await connect(alice, conversation.pk)
    await ws.receive_json_from(timeout=10)
    await sync_to_async(Part.objects.filter(pk=part.pk).update)(
        state="succeeded", seq=3, text="Hello!"
    )
    await sync_to_async(services.announce_branch)(conversation.pk)
    branch = await ws.receive_json_from(timeout=10)
    assert branch["type"] == "conversation.branch"
    assert [m["parts"][0]["seq"] for m in branch["messages"] if m["role"] == "assistant"] == [3]
    await sync_to_async(events.send)(
        conversation.pk, events.delta_event(part.pk, part.message_id, 3, "!")
    )
    assert await ws.receive_nothing(timeout=0.3)  # seq 3 came with the branch
    await ws.disconnect()


async def test_readers_that_join_at_once_each_get_their_conversations_events(alice):
    """Two first joins at once on a fresh hub share one subscription connection (once each
    opened its own, and one conversation's events went to the connection nobody read)."""
    create = sync_to_async(Conversation.objects.create)
    first, second = await create(owner=alice), await create(owner=alice)
    hub = fanout.hub()
    readers = await asyncio.gather(hub.join(first.pk), hub.join(second.pk))
    for conversation, reader in zip((first, second), readers, strict=True):
        event = {"type": "message.state", "message_id": conversation.pk, "status": "x"}
        await sync_to_async(events.send)(conversation.pk, event)
        assert (await asyncio.wait_for(reader.next(), 10)).event == event
        reader.close()
