"""Users' API keys and the requests made with them, in the admin.

An admin creates a key for a user (its token is shown on the page that answers the add, once,
and stored nowhere), renames or revokes it; requests are read-only, each naming its key.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from inference.api.keys import ApiKey, ApiRequest, key_issue, key_revoke


class RevokedFilter(admin.SimpleListFilter):
    title = "revoked"
    parameter_name = "revoked"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return [("yes", "revoked"), ("no", "live")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() in ("yes", "no"):
            return queryset.filter(revoked_at__isnull=self.value() == "no")
        return queryset


@admin.action(description="Revoke the selected keys")
def revoke_keys(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    """Through the same service as the owner's page; already revoked keys are skipped."""
    revoked = sum(key_revoke(key) for key in queryset)
    modeladmin.message_user(request, f"{revoked} key(s) revoked.", messages.SUCCESS)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = [RevokedFilter, ("created_at", admin.DateFieldListFilter)]
    search_fields = ["name", "=prefix", "owner__username"]
    list_select_related = ["owner"]
    actions = [revoke_keys]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        return ["owner", "name"] if obj is None else ["owner", "name", *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        """The owner is chosen once: a key never changes hands."""
        return [] if obj is None else ["owner", *self.readonly_fields]

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if change:
            obj.save(update_fields=["name"])
        else:
            obj.token = key_issue(obj)  # kept on the object only until response_add shows it

    def response_add(self, request: HttpRequest, obj: ApiKey, post_url_continue=None):
        """The new token, once, instead of a redirect: a redirect would have to store it."""
        return TemplateResponse(
            request,
            "admin/inference/apikey/created.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "key": obj,
                "token": obj.token,
                "title": f"API key {obj.name} created",
            },
        )


@admin.register(ApiRequest)
class ApiRequestAdmin(admin.ModelAdmin):
    """Read-only: the API records these, people only read them."""

    list_display = ["id", "owner", "key_link", "route", "status", "started_at", "finished_at"]
    list_filter = ["route", "status", ("started_at", admin.DateFieldListFilter)]
    search_fields = ["owner__username", "=key__prefix", "key__name"]
    list_select_related = ["owner", "key"]
    show_full_result_count = False
    fields = ["owner", "key_link", "route", "status", "process", "started_at", "finished_at"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    @admin.display(description="key", ordering="key__name")
    def key_link(self, record: ApiRequest) -> str:
        if record.key is None:
            return "deleted key"
        url = reverse("admin:inference_apikey_change", args=[record.key_id])
        return format_html('<a href="{}">{}</a>', url, str(record.key))
