"""The operator's view of conversations, messages and parts.

Everything here is read-only: a part's state moves only through the services, so the only way
to change one is an action (chat/admin_actions.py), each guarded by its own permission. The
derived columns (message status, timings) are SQL annotations (chat/admin_queries.py), so a
changelist costs the same few queries at 100 rows or 100,000.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from chat.admin_actions import PartActions
from chat.admin_queries import message_status, stuck_parts, with_branches, with_timings
from chat.conversations import conversation_delete
from chat.models import Conversation, Message, Part


def readable(delta: timedelta | None) -> str | None:
    """850 ms, 2.4 s, 3 min 12 s: the unit a person reads at a glance."""
    if delta is None:
        return None
    seconds = delta.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def admin_link(obj, label: str | None = None) -> str:
    url = reverse(f"admin:chat_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, label or str(obj))


def status_label(status: str | None) -> str | None:
    return Message.Status(status).label if status else None


class MessageStatusFilter(admin.SimpleListFilter):
    """The derived status, filtered in SQL on the `message_status` annotation."""

    title = "message status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return Message.Status.choices

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() in Message.Status.values:
            return queryset.filter(message_status=self.value())
        return queryset


class StuckFilter(admin.SimpleListFilter):
    """Parts (or messages with a part) not final TANDEM_STUCK_AFTER seconds after queueing."""

    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        after = readable(timedelta(seconds=settings.TANDEM_STUCK_AFTER))
        return [("yes", f"not final after {after}"), ("no", "no")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() not in ("yes", "no"):
            return queryset
        column = "pk" if queryset.model is Part else "message_id"
        stuck = stuck_parts(Part.objects.all()).values(column)
        if self.value() == "yes":
            return queryset.filter(pk__in=stuck)
        return queryset.exclude(pk__in=stuck)


class NoHandEdits:
    """Rows are written by the chat's services, never by hand."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class ReadOnlyAdmin(NoHandEdits, admin.ModelAdmin):
    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


EMPTY = "-"


def shown(value) -> str:
    """Read-only fields print None as "None"; show the changelist's empty mark instead."""
    return EMPTY if value is None else str(value)


class ReadOnlyInline(NoHandEdits, admin.TabularInline):
    """Inline rows to look at and follow to their own page."""

    extra = 0
    show_change_link = True
    can_delete = False


class DerivedColumns:
    """Columns read from the annotations (chat/admin_queries.py); sortable, in ms / s / min."""

    @admin.display(description="status", ordering="message_status")
    def status(self, obj) -> str:
        return shown(status_label(obj.message_status))

    @admin.display(description="queue wait", ordering="queue_wait")
    def queue_wait(self, part: Part) -> str:
        return shown(readable(part.queue_wait))

    @admin.display(description="first token", ordering="ttft")
    def time_to_first_token(self, part: Part) -> str:
        return shown(readable(part.ttft))

    @admin.display(description="duration", ordering="duration")
    def run_time(self, part: Part) -> str:
        return shown(readable(part.duration))

    @admin.display(description="tokens in", ordering="prompt_tokens")
    def tokens_in(self, part: Part) -> str:
        return shown(part.prompt_tokens)

    @admin.display(description="tokens out", ordering="completion_tokens")
    def tokens_out(self, part: Part) -> str:
        return shown(part.completion_tokens)

    @admin.display(description="error")
    def error_short(self, part: Part) -> str:
        return Truncator(part.error).chars(80)


TIMING_FIELDS = [
    "queued_at",
    "started_at",
    "first_token_at",
    "finished_at",
    "queue_wait",
    "time_to_first_token",
    "run_time",
    "tokens_in",
    "tokens_out",
    "updated_at",
]


@admin.register(Part)
class PartAdmin(PartActions, DerivedColumns, ReadOnlyAdmin):
    list_display = [
        "id",
        "owner",
        "reply_link",
        "kind",
        "state",
        "status",
        "queue_wait",
        "time_to_first_token",
        "run_time",
        "tokens_in",
        "tokens_out",
        "attempt",
        "error_short",
    ]
    list_filter = [
        "state",
        "kind",
        MessageStatusFilter,
        StuckFilter,
        ("queued_at", admin.DateFieldListFilter),
    ]
    search_fields = [
        "=engine_request_id",
        "=task_id",
        "message__conversation__owner__username",
        "text",
    ]
    search_help_text = "Engine request id or task id (exact), user name, or words of the text."
    list_select_related = ["message__conversation__owner"]
    show_full_result_count = False
    actions = ["retry_image", "cancel_generation", "mark_failed"]
    readonly_fields = [
        "owner",
        "reply_link",
        "message_link",
        "conversation_link",
        "status",
        *TIMING_FIELDS,
    ]
    fieldsets = [
        (None, {"fields": ["owner", "conversation_link", "message_link", "index", "kind"]}),
        ("state", {"fields": ["state", "status", "attempt", "error", "finish_reason"]}),
        ("content", {"fields": ["text", "seq", "image", "previous_image", "progress"]}),
        ("where it runs", {"fields": ["engine_request_id", "task_id", "stream_owner"]}),
        ("timings and tokens", {"fields": TIMING_FIELDS}),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Part]:
        return with_timings(super().get_queryset(request))

    def parts_of(self, queryset: QuerySet[Part], kind: str | None = None) -> QuerySet[Part]:
        return queryset

    @admin.display(description="owner", ordering="message__conversation__owner__username")
    def owner(self, part: Part) -> str:
        return part.message.conversation.owner.get_username()

    @admin.display(description="message", ordering="message_id")
    def message_link(self, part: Part) -> str:
        return admin_link(part.message, f"#{part.message_id}")

    @admin.display(description="conversation", ordering="message__conversation_id")
    def conversation_link(self, part: Part) -> str:
        return admin_link(part.message.conversation, f"#{part.message.conversation_id}")

    @admin.display(description="conversation › message", ordering="message_id")
    def reply_link(self, part: Part) -> str:
        return format_html("{} › {}", self.conversation_link(part), self.message_link(part))


class PartInline(DerivedColumns, ReadOnlyInline):
    """A message's parts, every version, in order, read-only, each linking to its own page."""

    model = Part
    fields = [
        "version",
        "index",
        "kind",
        "state",
        "attempt",
        "queue_wait",
        "time_to_first_token",
        "run_time",
        "tokens_in",
        "tokens_out",
        "error_short",
    ]
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Part]:
        return with_timings(super().get_queryset(request))


class BranchColumns:
    """Which branch a message is (of its edits) and which version of a reply is shown, from
    `with_branches`' annotations."""

    @admin.display(description="branch", ordering="branch_number")
    def branch(self, message: Message) -> str:
        return f"{message.branch_number} / {message.branch_total}"

    @admin.display(description="version")
    def version(self, message: Message) -> str | None:
        if message.role != Message.Role.ASSISTANT:
            return None
        return f"{message.shown_version} / {message.version_total}"


@admin.register(Message)
class MessageAdmin(PartActions, BranchColumns, DerivedColumns, ReadOnlyAdmin):
    list_display = [
        "id",
        "owner",
        "conversation_link",
        "position",
        "role",
        "status",
        "branch",
        "version",
        "parts_summary",
        "created_at",
    ]
    list_filter = [
        MessageStatusFilter,
        StuckFilter,
        "role",
        "wants_image",
        ("created_at", admin.DateFieldListFilter),
    ]
    search_fields = [
        "=parts__engine_request_id",
        "=parts__task_id",
        "conversation__owner__username",
        "text",
    ]
    search_help_text = "Engine request id or task id (exact), user name, or the user's words."
    list_select_related = ["conversation__owner"]
    show_full_result_count = False
    actions = ["retry_image", "cancel_generation", "mark_failed"]
    inlines = [PartInline]
    readonly_fields = ["owner", "conversation_link", "status", "parent_link", "branch", "version"]
    fields = [
        "owner",
        "conversation_link",
        "position",
        "parent_link",
        "role",
        "status",
        "branch",
        "shown",
        "version",
        "text",
        "wants_image",
        "history_truncated",
        "created_at",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        return with_branches(
            super()
            .get_queryset(request)
            .annotate(message_status=message_status("pk"))
            .prefetch_related("parts")
        )

    @admin.display(description="follows", ordering="parent_id")
    def parent_link(self, message: Message) -> str | None:
        return admin_link(message.parent, f"#{message.parent_id}") if message.parent_id else None

    def parts_of(self, queryset: QuerySet[Message], kind: str | None = None) -> QuerySet[Part]:
        parts = Part.objects.filter(message__in=queryset.values("pk"))
        return parts.filter(kind=kind) if kind else parts

    @admin.display(description="owner", ordering="conversation__owner__username")
    def owner(self, message: Message) -> str:
        return message.conversation.owner.get_username()

    @admin.display(description="conversation", ordering="conversation_id")
    def conversation_link(self, message: Message) -> str:
        return admin_link(message.conversation, f"#{message.conversation_id}")

    @admin.display(description="parts")
    def parts_summary(self, message: Message) -> str:
        return ", ".join(f"{part.kind} {part.state}" for part in message.shown_parts())


class MessageInline(BranchColumns, ReadOnlyInline):
    """A conversation's messages, every branch, in order, each linking to its page with its
    parts; `shown` marks the branch on screen at each edited message."""

    model = Message
    fields = [
        "position",
        "role",
        "status",
        "branch",
        "shown",
        "version",
        "text_short",
        "created_at",
    ]
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        queryset = super().get_queryset(request).annotate(message_status=message_status("pk"))
        return with_branches(queryset).order_by("position", "pk")

    @admin.display(description="status")
    def status(self, message: Message) -> str:
        return shown(status_label(message.message_status))

    @admin.display(description="text")
    def text_short(self, message: Message) -> str:
        return Truncator(message.text).chars(80)


@admin.register(Conversation)
class ConversationAdmin(NoHandEdits, admin.ModelAdmin):
    """Conversations, read-only, and deleted only through `conversation_delete`.

    Django's delete button and its "delete selected" action both end in `delete_model` /
    `delete_queryset`, which call the service: replies in progress are stopped, the image
    files removed and open pages told, as when the owner deletes it.
    """

    list_display = [
        "id",
        "title",
        "owner",
        "message_count",
        "temperature",
        "top_p",
        "max_new_tokens",
        "created_at",
        "updated_at",
    ]
    list_filter = [("created_at", admin.DateFieldListFilter)]
    search_fields = ["title", "owner__username"]
    list_select_related = ["owner"]
    show_full_result_count = False
    inlines = [MessageInline]
    fieldsets = [
        (None, {"fields": ["title", "owner", "created_at", "updated_at"]}),
        (
            "settings",
            {
                "fields": [
                    "system_prompt",
                    "temperature",
                    "top_p",
                    "max_new_tokens",
                    "image_by_default",
                ]
            },
        ),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Conversation]:
        return super().get_queryset(request).annotate(messages_total=Count("messages"))

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return request.user.has_perm("chat.delete_conversation")

    def delete_model(self, request: HttpRequest, obj: Conversation) -> None:
        conversation_delete(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        for conversation in queryset:
            conversation_delete(conversation)

    def get_deleted_objects(self, objs, request: HttpRequest):
        """The confirmation lists the messages and parts that go too; deleting them needs no
        permission of their own (their admins are read-only): they go with the conversation."""
        deleted, counts, _, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected

    @admin.display(description="messages", ordering="messages_total")
    def message_count(self, conversation: Conversation) -> int:
        return conversation.messages_total
