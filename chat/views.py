"""Chat pages and their JSON actions; thin, the logic lives in services."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from chat import conversations, export, services
from chat.models import Conversation, Message, Part
from chat.search import conversation_search
from chat.snapshot import conversation_snapshot, message_payload
from inference.api import keys
from media.services import image_redraw
from media.services import image_retry as retry


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """The conversation list, or those matching `?q=` (titles and the words said in them)."""
    query = request.GET.get("q", "").strip()[:200]
    found = conversation_search(request.user, query)[:100]
    return render(request, "chat/home.html", {"conversations": found, "query": query})


@login_required
@require_GET
def conversation_new(request: HttpRequest) -> HttpResponse:
    """An empty conversation page; nothing is saved until its first message is sent."""
    return render(
        request,
        "chat/conversation.html",
        {
            "conversation": None,
            "settings": conversations.conversation_fields(Conversation())["settings"],
            "conversations": Conversation.objects.filter(owner=request.user)[:100],
            "initial": [],
        },
    )


@login_required
@require_GET
def conversation(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """One conversation: its messages as saved, then live updates over the WebSocket."""
    convo = get_object_or_404(Conversation, pk=conversation_id, owner=request.user)
    return render(
        request,
        "chat/conversation.html",
        {
            "conversation": convo,
            "settings": conversations.conversation_fields(convo)["settings"],
            "conversations": Conversation.objects.filter(owner=request.user)[:100],
            "initial": conversation_snapshot(convo.pk),
        },
    )


def json_body(request: HttpRequest) -> dict | None:
    """The request's JSON object, or None when the body is not one."""
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def owned_conversation(request: HttpRequest, conversation_id: int) -> Conversation:
    return get_object_or_404(Conversation, pk=conversation_id, owner=request.user)


@login_required
@require_POST
def conversation_rename(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """POST JSON {"title"}: 200 with the conversation as saved, 422 with what is wrong."""
    convo = owned_conversation(request, conversation_id)
    body = json_body(request)
    if body is None or not isinstance(body.get("title"), str):
        return JsonResponse({"error": 'Send {"title": "..."}.'}, status=400)
    try:
        conversations.conversation_rename(convo, body["title"])
    except conversations.ConversationInvalid as invalid:
        return JsonResponse({"error": str(invalid), "errors": invalid.errors}, status=422)
    return JsonResponse({"conversation": conversation_payload(convo)})


@login_required
@require_POST
def conversation_settings(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """POST JSON with any of the settings: 200 with all of them as saved, 422 per field."""
    convo = owned_conversation(request, conversation_id)
    body = json_body(request)
    if body is None:
        return JsonResponse({"error": "Send the settings as a JSON object."}, status=400)
    try:
        conversations.conversation_settings_update(convo, body)
    except conversations.ConversationInvalid as invalid:
        return JsonResponse({"error": str(invalid), "errors": invalid.errors}, status=422)
    return JsonResponse({"conversation": conversation_payload(convo)})


@login_required
@require_POST
def conversation_delete(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """Delete the conversation (stopping its replies in progress); the page goes home."""
    conversations.conversation_delete(owned_conversation(request, conversation_id))
    return JsonResponse({"deleted": conversation_id, "redirect": reverse("home")})


EXPORTS = {
    "md": (export.as_markdown, "text/markdown; charset=utf-8"),
    "json": (export.as_json, "application/json"),
}


@login_required
@require_GET
def conversation_export(request: HttpRequest, conversation_id: int, fmt: str) -> HttpResponse:
    """The whole conversation as a Markdown or JSON download."""
    convo = owned_conversation(request, conversation_id)
    if fmt not in EXPORTS:
        raise Http404("No such export format.")
    build, content_type = EXPORTS[fmt]
    response = HttpResponse(build(convo), content_type=content_type)
    name = f"{slugify(convo.title)[:50] or 'conversation'}-{convo.pk}.{fmt}"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def refused(error: services.TurnRefused) -> JsonResponse:
    response = JsonResponse({"error": error.message}, status=error.status)
    if error.retry_after:
        response["Retry-After"] = str(error.retry_after)
    return response


def conversation_payload(convo: Conversation) -> dict:
    """What the page needs to become this conversation's page after its first message."""
    return conversations.conversation_fields(convo) | {
        "url": reverse("conversation", args=[convo.pk]),
        "turns_url": reverse("turn-create", args=[convo.pk]),
    }


@login_required
@require_POST
def turn_create(request: HttpRequest, conversation_id: int | None = None) -> HttpResponse:
    """POST JSON {"text", "image"}: 201 with the reply's message and its placeholder parts.

    Without a conversation id (`/c/new/turns`) the first message creates the conversation;
    the answer says where it lives.
    """
    convo = None
    if conversation_id is not None:
        convo = get_object_or_404(Conversation, pk=conversation_id, owner=request.user)
    body = json_body(request)
    if body is None or not isinstance(body.get("text", ""), str):
        return JsonResponse({"error": 'Send {"text": "...", "image": false}.'}, status=400)
    new_settings = None
    if convo is None and body.get("settings") is not None:  # the first turn may bring them
        if not isinstance(body["settings"], dict):
            return JsonResponse({"error": "settings must be a JSON object."}, status=400)
        try:
            new_settings = conversations.valid_settings(body["settings"])
        except conversations.ConversationInvalid as invalid:
            return JsonResponse({"error": str(invalid), "errors": invalid.errors}, status=422)
    try:
        reply = services.turn_create(
            request.user, convo, body.get("text", ""), bool(body.get("image")), new_settings
        )
    except services.TurnRefused as error:
        return refused(error)
    return JsonResponse(
        {
            "conversation": conversation_payload(reply.conversation),
            "user": message_payload(reply.parent),
            "reply": message_payload(reply),
        },
        status=201,
    )


@login_required
@require_POST
def message_stop(request: HttpRequest, message_id: int) -> HttpResponse:
    services.message_stop(own_message(request, message_id, Message.Role.ASSISTANT))
    return JsonResponse({"ok": True}, status=202)


def own_message(request: HttpRequest, message_id: int, role: Message.Role) -> Message:
    """The user's own message of that role, or 404 (another user's is as absent as none)."""
    return get_object_or_404(Message, pk=message_id, conversation__owner=request.user, role=role)


@login_required
@require_POST
def message_regenerate(request: HttpRequest, message_id: int) -> HttpResponse:
    """A new version of a finished reply: 202 with the reply as it now stands."""
    try:
        message = services.reply_regenerate(
            request.user, own_message(request, message_id, Message.Role.ASSISTANT)
        )
    except services.TurnRefused as error:
        return refused(error)
    return JsonResponse({"message": message_payload(message)}, status=202)


@login_required
@require_POST
def message_version(request: HttpRequest, message_id: int) -> HttpResponse:
    """POST JSON {"version": n}: show that version of the reply (and use it in the history)."""
    message = own_message(request, message_id, Message.Role.ASSISTANT)
    body = json_body(request)
    if body is None or type(body.get("version")) is not int:
        return JsonResponse({"error": 'Send {"version": 2}.'}, status=400)
    try:
        message = services.reply_show_version(message, body["version"])
    except services.TurnRefused as error:
        return refused(error)
    return JsonResponse({"message": message_payload(message)})


@login_required
@require_POST
def message_edit(request: HttpRequest, message_id: int) -> HttpResponse:
    """POST JSON {"text"}: the edited message starts a new branch; 201 with the branch now
    on screen (`messages`) and the new reply's id."""
    message = own_message(request, message_id, Message.Role.USER)
    body = json_body(request)
    if body is None or not isinstance(body.get("text"), str):
        return JsonResponse({"error": 'Send {"text": "..."}.'}, status=400)
    try:
        reply = services.message_edit(request.user, message, body["text"])
    except services.TurnRefused as error:
        return refused(error)
    return JsonResponse(
        {"reply_id": reply.pk, "messages": conversation_snapshot(reply.conversation_id)},
        status=201,
    )


@login_required
@require_POST
def message_branch(request: HttpRequest, message_id: int) -> HttpResponse:
    """POST JSON {"branch": n}: show that branch at this user message (and use it in the
    model's history); 200 with the branch now on screen."""
    message = own_message(request, message_id, Message.Role.USER)
    body = json_body(request)
    if body is None or type(body.get("branch")) is not int:
        return JsonResponse({"error": 'Send {"branch": 2}.'}, status=400)
    try:
        services.message_show_branch(message, body["branch"])
    except services.TurnRefused as error:
        return refused(error)
    return JsonResponse({"messages": conversation_snapshot(message.conversation_id)})


@login_required
@require_POST
def image_retry(request: HttpRequest, part_id: int) -> HttpResponse:
    part = get_object_or_404(
        Part, pk=part_id, kind=Part.Kind.IMAGE, message__conversation__owner=request.user
    )
    if retry(part) is None:
        return JsonResponse(
            {"error": "Only a failed or cancelled image can be retried."}, status=409
        )
    return JsonResponse({"ok": True}, status=202)


@login_required
@require_POST
def image_new(request: HttpRequest, part_id: int) -> HttpResponse:
    """ "New image" on a finished picture: a new attempt, the old picture shown until it is done."""
    part = get_object_or_404(
        Part, pk=part_id, kind=Part.Kind.IMAGE, message__conversation__owner=request.user
    )
    if image_redraw(part) is None:
        return JsonResponse({"error": "Only a finished picture can be drawn again."}, status=409)
    return JsonResponse({"ok": True}, status=202)


@login_required
@require_GET
def part_image(request: HttpRequest, name: str) -> HttpResponse:
    """A generated image, only for the owner of its conversation (MEDIA_URL is not public)."""
    part = get_object_or_404(
        Part.objects.filter(Q(image=name) | Q(previous_image=name)),
        kind=Part.Kind.IMAGE,
        message__conversation__owner=request.user,
    )
    picture = part.image if part.image.name == name else part.previous_image
    response = FileResponse(picture.open("rb"), content_type="image/png")
    response["Cache-Control"] = "private, max-age=86400"
    return response


@login_required
@never_cache
@require_http_methods(["GET", "POST"])
def api_keys(request: HttpRequest) -> HttpResponse:
    """The user's API keys; POST `name` creates one, whose token this answer alone shows
    (a redirect would have to store it somewhere first), never cached."""
    created, error, status = None, None, 200
    if request.method == "POST":
        try:
            created = keys.key_create(request.user, request.POST.get("name", ""))
        except keys.KeyNameInvalid as invalid:
            error, status = str(invalid), 422
    context = {
        "keys": keys.keys_of(request.user),
        "created": created,
        "error": error,
        "name_limit": keys.ApiKey._meta.get_field("name").max_length,
    }
    return render(request, "chat/api_keys.html", context, status=status)


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    """Revoke one of the user's keys (another user's is a 404), then back to the list."""
    keys.key_revoke(get_object_or_404(keys.ApiKey, pk=key_id, owner=request.user))
    return redirect("api-keys")
