"""The admin's derived columns as SQL, so a changelist of any size costs a fixed few queries.

A message's status is never stored (chat/states.py derives it from its parts' states); here the
same rule is one correlated subquery, usable as an annotation, a filter and a sort key.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import (
    Case,
    CharField,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from chat.models import Message, Part
from chat.states import TERMINAL

STATUS = Message.Status


def message_status(message_ref: str) -> Subquery:
    """The status of the message whose id is `message_ref` in the outer query (None: no parts).

    The same rule as `chat.states.message_status`: in progress while a part is not final,
    complete when all succeeded, partial when some did, failed when none did.
    """
    statuses = (
        Part.objects.filter(message_id=OuterRef(message_ref), version=F("message__shown_version"))
        .order_by()
        .values("message_id")
        .alias(
            total=Count("pk"),
            unfinished=Count("pk", filter=~Q(state__in=TERMINAL)),
            succeeded=Count("pk", filter=Q(state=Part.State.SUCCEEDED)),
        )
        .annotate(
            status=Case(
                When(unfinished__gt=0, then=Value(STATUS.IN_PROGRESS)),
                When(succeeded=F("total"), then=Value(STATUS.COMPLETE)),
                When(succeeded__gt=0, then=Value(STATUS.PARTIAL)),
                default=Value(STATUS.FAILED),
                output_field=CharField(),
            )
        )
        .values("status")
    )
    return Subquery(statuses, output_field=CharField())


def with_branches(messages: QuerySet[Message]) -> QuerySet[Message]:
    """`branch_number` / `branch_total`: which of its siblings (its edits, oldest first) a
    message is, and how many there are; `version_total`: the versions of a reply."""
    same_fork = (
        Message.objects.filter(
            conversation_id=OuterRef("conversation_id"), position=OuterRef("position")
        )
        .alias(fork=Coalesce("parent_id", Value(0)))
        .filter(fork=Coalesce(OuterRef("parent_id"), Value(0)))
        .order_by()
        .values("conversation_id")
    )
    versions = (
        Part.objects.filter(message_id=OuterRef("pk"))
        .order_by()
        .values("message_id")
        .annotate(top=Max("version"))
        .values("top")
    )
    return messages.annotate(
        branch_number=Subquery(
            same_fork.filter(pk__lte=OuterRef("pk")).annotate(n=Count("pk")).values("n")
        ),
        branch_total=Subquery(same_fork.annotate(n=Count("pk")).values("n")),
        version_total=Coalesce(Subquery(versions), Value(1)),
    )


def stuck_parts(parts: QuerySet[Part]) -> QuerySet[Part]:
    """Parts not final TANDEM_STUCK_AFTER seconds after they were queued (or their message
    was written, for a part that never recorded its queueing)."""
    cutoff = timezone.now() - timedelta(seconds=settings.TANDEM_STUCK_AFTER)
    return parts.alias(since=Coalesce("queued_at", "message__created_at")).filter(
        ~Q(state__in=TERMINAL), since__lt=cutoff
    )


def between(start: str, end: str) -> ExpressionWrapper:
    return ExpressionWrapper(F(end) - F(start), output_field=DurationField())


def with_timings(parts: QuerySet[Part]) -> QuerySet[Part]:
    """Queue wait (queued → started), time to first token (started → first token: the engine's
    own wait plus the prompt), and duration (started → finished), as sortable columns."""
    return parts.annotate(
        queue_wait=between("queued_at", "started_at"),
        ttft=between("started_at", "first_token_at"),
        duration=between("started_at", "finished_at"),
        message_status=message_status("message_id"),
    )
