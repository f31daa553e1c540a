"""The admin's actions on parts: retry an image, cancel a generation, mark a part failed.

Each goes through the same service as the chat UI (or the guarded `part_mark_failed`), so the
state machine decides and the browser hears about it. Every row gets an outcome, and the
operator gets one line per outcome saying how many rows and which were skipped, and why.
"""

from __future__ import annotations

from collections import defaultdict

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from chat import services
from chat.models import Part
from chat.states import TERMINAL
from media.services import image_cancel, image_retry

# Outcomes: a done outcome is a change the action made; a skip says why nothing changed.
REQUEUED = "image(s) queued again"
NOT_RETRYABLE = "skipped: not a failed or cancelled image"
CANCELLED = "cancelled"
STOP_SENT = "stop sent to the engine (the text ends cancelled after its next step)"
NOT_HERE = "skipped: not streaming in this web process's engine (mark it failed instead)"
FINISHED = "skipped: already finished"
MARKED_FAILED = "marked failed"
DONE = frozenset({REQUEUED, CANCELLED, STOP_SENT, MARKED_FAILED})
MARK_FAILED_REASON = "Stopped by an operator."
SHOWN_IDS = 10


def retry_one(part: Part) -> str:
    return REQUEUED if image_retry(part) is not None else NOT_RETRYABLE


def cancel_one(part: Part) -> str:
    """The chat's stop button for one part: the text through `text_stop`, an image through
    `image_cancel`. A streaming text is cancelled by its engine, asynchronously."""
    if part.state in TERMINAL:
        return FINISHED
    if part.kind == Part.Kind.IMAGE:
        return CANCELLED if image_cancel(part) is not None else FINISHED
    streaming = part.state == Part.State.STREAMING
    if services.text_stop(part.message):
        return STOP_SENT if streaming else CANCELLED
    return NOT_HERE if streaming else FINISHED


def fail_one(part: Part) -> str:
    failed = services.part_mark_failed(part, MARK_FAILED_REASON)
    return MARKED_FAILED if failed is not None else FINISHED


def apply(
    modeladmin: admin.ModelAdmin, request: HttpRequest, parts: QuerySet[Part], act, name: str
) -> None:
    """Run `act` on each part, record each change in the admin's history, report per outcome."""
    outcomes: dict[str, list[int]] = defaultdict(list)
    for part in parts.select_related("message"):
        outcome = act(part)
        outcomes[outcome].append(part.pk)
        if outcome in DONE:
            modeladmin.log_change(request, part, f"{name}: {outcome}")
    if not outcomes:
        modeladmin.message_user(request, "No parts to act on.", messages.WARNING)
        return
    for outcome, ids in outcomes.items():
        text = f"{len(ids)} {outcome}"
        if outcome not in DONE:
            shown = ", ".join(str(pk) for pk in sorted(ids)[:SHOWN_IDS])
            text += f" (part {shown}{', …' if len(ids) > SHOWN_IDS else ''})"
        level = messages.SUCCESS if outcome in DONE else messages.WARNING
        modeladmin.message_user(request, text, level)


class PartActions:
    """The actions and their permissions, for any admin whose rows map to parts (`parts_of`)."""

    def parts_of(self, queryset: QuerySet, kind: str | None = None) -> QuerySet[Part]:
        """The parts behind the selected rows (only those of `kind`, where rows hold several)."""
        raise NotImplementedError

    def has_retry_image_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chat.retry_image")

    def has_cancel_generation_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chat.cancel_generation")

    def has_mark_failed_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chat.mark_failed")

    @admin.action(
        description="Retry image (failed or cancelled images)", permissions=["retry_image"]
    )
    def retry_image(self, request: HttpRequest, queryset: QuerySet) -> None:
        parts = self.parts_of(queryset, kind=Part.Kind.IMAGE)
        apply(self, request, parts, retry_one, "retry image")

    @admin.action(
        description="Cancel generation (as the Stop button)", permissions=["cancel_generation"]
    )
    def cancel_generation(self, request: HttpRequest, queryset: QuerySet) -> None:
        apply(self, request, self.parts_of(queryset), cancel_one, "cancel generation")

    @admin.action(description="Mark failed (unfinished parts)", permissions=["mark_failed"])
    def mark_failed(self, request: HttpRequest, queryset: QuerySet) -> None:
        apply(self, request, self.parts_of(queryset), fail_one, "mark failed")
