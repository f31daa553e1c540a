"""The SSE view in-process, for what a real client cannot time: leaving between the view's
return and the stream's start."""

import asyncio
import gc

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.test import AsyncRequestFactory

from chat import fanout, sse
from chat.models import Part
from tests.chat.test_consumer import streaming_reply

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@sync_to_async
def signed_in_request(user, path: str):
    """A GET of `path` carrying `user`'s session, as the middleware leaves it."""
    request = AsyncRequestFactory().get(path)
    request.session = SessionStore()
    request.session[SESSION_KEY] = str(user.pk)
    request.session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    request.session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    return request


async def test_a_stream_its_client_left_before_it_started_leaves_no_reader(alice, conversation):
    part = await sync_to_async(streaming_reply)(conversation, "Hello", 2, [" wor"])
    reply_id = part.message_id
    hub = fanout.hub()
    before = hub.readers
    request = await signed_in_request(alice, f"/m/{reply_id}/events")

    response = await sse.events(request, reply_id)
    assert response.status_code == 200
    assert hub.readers == before + 1  # joined, and the stream not yet iterated

    del response, request  # the client went away: Django drops the response unsent
    gc.collect()
    await asyncio.sleep(0)  # the close is scheduled on the loop
    assert hub.readers == before


async def test_a_stream_read_to_its_end_leaves_no_reader(alice, conversation):
    part = await sync_to_async(streaming_reply)(conversation, "Hello", 2, [])
    reply_id = part.message_id
    await sync_to_async(Part.objects.filter(pk=part.pk).update)(state="succeeded")
    hub = fanout.hub()
    before = hub.readers
    response = await sse.events(await signed_in_request(alice, f"/m/{reply_id}/events"), reply_id)
    frames = [frame async for frame in response.streaming_content]
    assert frames[-1].startswith(b"event: message.state")
    gc.collect()
    await asyncio.sleep(0)
    assert hub.readers == before
