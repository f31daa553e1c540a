"""Chat routes (the conversation list is `/`, see config/urls.py)."""

from django.urls import path

from chat import sse, views

urlpatterns = [
    path("c/new", views.conversation_new, name="conversation-new"),
    path("c/new/turns", views.turn_create, name="turn-first"),
    path("c/<int:conversation_id>/", views.conversation, name="conversation"),
    path("c/<int:conversation_id>/turns", views.turn_create, name="turn-create"),
    path("c/<int:conversation_id>/rename", views.conversation_rename, name="conversation-rename"),
    path(
        "c/<int:conversation_id>/settings",
        views.conversation_settings,
        name="conversation-settings",
    ),
    path("c/<int:conversation_id>/delete", views.conversation_delete, name="conversation-delete"),
    path(
        "c/<int:conversation_id>/export.<str:fmt>",
        views.conversation_export,
        name="conversation-export",
    ),
    path("m/<int:message_id>/stop", views.message_stop, name="message-stop"),
    path("m/<int:message_id>/events", sse.events, name="message-events"),
    path("m/<int:message_id>/regenerate", views.message_regenerate, name="message-regenerate"),
    path("m/<int:message_id>/version", views.message_version, name="message-version"),
    path("m/<int:message_id>/edit", views.message_edit, name="message-edit"),
    path("m/<int:message_id>/branch", views.message_branch, name="message-branch"),
    path("parts/<int:part_id>/retry", views.image_retry, name="image-retry"),
    path("parts/<int:part_id>/new-image", views.image_new, name="image-new"),
    path("media/<path:name>", views.part_image, name="part-image"),
    path("keys/", views.api_keys, name="api-keys"),
    path("keys/<int:key_id>/revoke", views.api_key_revoke, name="api-key-revoke"),
]
