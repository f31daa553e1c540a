"""Chat pages and their JSON actions; thin, the logic lives in services."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from chat import services
from chat.models import Conversation, Message, Part
from chat.snapshot import conversation_snapshot, message_payload
from media.services import image_retry as retry


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """The conversation list."""
    conversations = Conversation.objects.filter(owner=request.user)[:100]
    return render(request, "chat/home.html", {"conversations": conversations})


@login_required
@require_POST
def conversation_new(request: HttpRequest) -> HttpResponse:
    conversation = Conversation.objects.create(owner=request.user)
    return redirect("conversation", conversation_id=conversation.pk)


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
            "conversations": Conversation.objects.filter(owner=request.user)[:100],
            "initial": conversation_snapshot(convo.pk),
        },
    )


def refused(error: services.TurnRefused) -> JsonResponse:
    response = JsonResponse({"error": error.message}, status=error.status)
    if error.retry_after:
        response["Retry-After"] = str(error.retry_after)
    return response


@login_required
@require_POST
def turn_create(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """POST JSON {"text", "image"}: 201 with the reply's message and its placeholder parts."""
    convo = get_object_or_404(Conversation, pk=conversation_id, owner=request.user)
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"error": "The request body must be JSON."}, status=400)
    if not isinstance(body, dict) or not isinstance(body.get("text", ""), str):
        return JsonResponse({"error": 'Send {"text": "...", "image": false}.'}, status=400)
    try:
        reply = services.turn_create(
            request.user, convo, body.get("text", ""), bool(body.get("image"))
        )
    except services.TurnRefused as error:
        return refused(error)
    user_message = Message.objects.get(conversation=convo, position=reply.position - 1)
    return JsonResponse(
        {"user": message_payload(user_message), "reply": message_payload(reply)}, status=201
    )


@login_required
@require_POST
def message_stop(request: HttpRequest, message_id: int) -> HttpResponse:
    message = get_object_or_404(
        Message, pk=message_id, conversation__owner=request.user, role=Message.Role.ASSISTANT
    )
    services.message_stop(message)
    return JsonResponse({"ok": True}, status=202)


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
@require_GET
def part_image(request: HttpRequest, name: str) -> HttpResponse:
    """A generated image, only for the owner of its conversation (MEDIA_URL is not public)."""
    part = get_object_or_404(
        Part, kind=Part.Kind.IMAGE, image=name, message__conversation__owner=request.user
    )
    response = FileResponse(part.image.open("rb"), content_type="image/png")
    response["Cache-Control"] = "private, max-age=86400"
    return response
