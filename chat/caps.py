"""The per-user cap on replies in flight (TANDEM_MAX_TURNS_IN_FLIGHT), shared by the chat and
the generation API: a chat reply being written and an API request made with the user's key
both count, so neither door lets a user past the cap the other enforces.
"""

from __future__ import annotations

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from chat import heartbeat
from chat.models import UNFINISHED_STATES, Conversation, Message, Part
from inference.api.keys import ApiKey, ApiRequest


class OverCap(Exception):
    """The user already has TANDEM_MAX_TURNS_IN_FLIGHT replies in flight."""

    retry_after = 5

    def __init__(self) -> None:
        cap = settings.TANDEM_MAX_TURNS_IN_FLIGHT
        super().__init__(f"You already have {cap} replies in progress; wait for one to finish.")
        self.message = str(self)


def process_alive(process: str) -> bool:
    """Whether the web process serving a request still runs; when Redis cannot say, assume
    it does, so an outage never lifts the cap."""
    if process == heartbeat.OWNER:
        return True
    try:
        return heartbeat.is_alive(process)
    except redis.RedisError:
        return True


def api_requests_in_flight(user_id: int) -> int:
    """The user's unfinished API requests whose process is alive (a crash leaves rows behind
    that would otherwise hold the cap for ever)."""
    processes = ApiRequest.objects.filter(owner_id=user_id, finished_at__isnull=True)
    counts: dict[str, int] = {}
    for process in processes.values_list("process", flat=True):
        counts[process] = counts.get(process, 0) + 1
    return sum(count for process, count in counts.items() if process_alive(process))


def replies_in_flight(user_id: int) -> int:
    """Chat replies with a part not yet final, plus API requests made with the user's keys.

    Statements whose cost does not grow with the history: the messages of the parts in
    flight, every user's (a few rows, read from their partial index `part_unfinished`), then
    those messages' conversations, each read by primary key. A join left the order to the
    planner, and on tables never analyzed (a server with autovacuum off) it guessed: past
    ~10,000 turns it compared every assistant message with every conversation of the user,
    0.2-0.7 s per call, twice per turn inside the admission lock (docs/reliability.md, "The
    late slowdown"). The owner is compared here, not in SQL: asked for it, the planner may read
    the user's conversations through their owner index instead.
    """
    in_flight = (
        Part.objects.filter(state__in=UNFINISHED_STATES).order_by().values_list("message_id")
    )
    message_ids = sorted({message_id for (message_id,) in in_flight})
    chat_replies = 0
    if message_ids:
        replies = Message.objects.filter(pk__in=message_ids, role=Message.Role.ASSISTANT)
        conversation_of = dict(replies.order_by().values_list("pk", "conversation_id"))
        owners = Conversation.objects.filter(pk__in=sorted(set(conversation_of.values())))
        owned = {
            pk for pk, owner in owners.order_by().values_list("pk", "owner_id") if owner == user_id
        }
        chat_replies = sum(conversation in owned for conversation in conversation_of.values())
    return chat_replies + api_requests_in_flight(user_id)


def over_cap(user_id: int) -> bool:
    return replies_in_flight(user_id) >= settings.TANDEM_MAX_TURNS_IN_FLIGHT


def hold_user(user_id: int) -> None:
    """Inside a transaction: wait for the user's other admissions in any web process to
    commit, so the count that follows sees them."""
    get_user_model().objects.select_for_update().filter(pk=user_id).exists()


def api_request_start(key: ApiKey, route: str) -> ApiRequest:
    """Admit one API request made with `key` against its owner's cap, or raise OverCap."""
    with transaction.atomic():
        hold_user(key.owner_id)
        if over_cap(key.owner_id):
            raise OverCap
        now = timezone.now()
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        return ApiRequest.objects.create(
            key=key, owner_id=key.owner_id, route=route[:100], process=heartbeat.OWNER
        )


def api_request_finish(request_id: int, status: int) -> None:
    """The request's response has been sent (or its client left): it no longer counts."""
    ApiRequest.objects.filter(pk=request_id, finished_at__isnull=True).update(
        finished_at=timezone.now(), status=status
    )
