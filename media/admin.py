"""The sweeper's actions in the admin, with a way to retry the images they failed."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from media.models import SweeperAction
from media.services import image_retry


@admin.action(description="Retry the images of the selected actions' parts")
def retry_images(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    """Queue again each failed or cancelled image part behind the selected actions."""
    parts = {action.part for action in queryset.select_related("part")}
    retried = [part for part in parts if image_retry(part) is not None]
    skipped = len(parts) - len(retried)
    modeladmin.message_user(
        request,
        f"{len(retried)} image(s) queued again; {skipped} skipped (not a failed or cancelled "
        "image).",
        messages.SUCCESS if retried else messages.WARNING,
    )


@admin.register(SweeperAction)
class SweeperActionAdmin(admin.ModelAdmin):
    """Read-only: the sweeper writes these, people only read them."""

    list_display = ["created_at", "action", "part", "part_state", "detail"]
    list_filter = ["action", "created_at"]
    search_fields = ["detail", "part__id"]
    date_hierarchy = "created_at"
    list_select_related = ["part"]
    actions = [retry_images]

    @admin.display(description="part state now")
    def part_state(self, action: SweeperAction) -> str:
        return action.part.state

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
