"""The turn's orchestration: create a turn, start its text, stop it, fail it for an operator;
regenerate a reply (versions) and edit a user message (branches).

Only views, consumers and admin actions call these. Every part change goes through
`chat.parts`, which saves it and tells the browser; the image side is `media.services`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chat import branches, caps, events, heartbeat, history, live_text, metrics
from chat.models import Conversation, Message, Part
from chat.parts import part_transition
from chat.snapshot import conversation_snapshot, message_payload
from config.logging import bind as bind_log_ids
from config.logging import bound as log_ids_scope
from inference.provisioning.runtime import model_runtime
from media.services import image_cancel, image_enqueue

if TYPE_CHECKING:  # the engine (torch) is imported lazily: Celery workers never need it
    from inference.engine import Engine
    from inference.provisioning.remote_engine import RemoteEngine

log = logging.getLogger(__name__)
# Turns of this process are admitted one at a time, from the limit checks until the text is in
# the engine's queue: concurrent requests would otherwise all pass the checks at once (200 at
# once let 112 through a per-user limit of 3 and past the engine's waiting places). Across web
# processes, the user's row is locked (SELECT ... FOR UPDATE; SQLite's BEGIN IMMEDIATE locks the
# whole file) from the checks until the turn's rows are committed: see `caps.hold_user`.
ADMISSION = threading.Lock()


class TurnRefused(Exception):
    """A turn cannot be created now; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


def current_engine() -> Engine | RemoteEngine | None:
    """Where this process's text comes from: its engine (None while it loads) or, with
    TANDEM_ENGINE set to URLs, the remote engines' client."""
    return model_runtime.remote or model_runtime.engine


def check_turn(user, text: str, engine: Engine | RemoteEngine | None) -> None:
    """Refuse before anything is written: bad input, too many turns, no engine, busy engine."""
    text = text.strip()
    if not text:
        raise TurnRefused(422, "Write a message first.")
    if len(text) > settings.TANDEM_MAX_MESSAGE_CHARS:
        raise TurnRefused(
            422,
            f"That message is {len(text):,} characters; the limit is "
            f"{settings.TANDEM_MAX_MESSAGE_CHARS:,}.",
        )
    check_capacity(user, engine)


def check_capacity(user, engine: Engine | RemoteEngine | None) -> None:
    """Refuse a new reply (a turn's or a regeneration's) the user or the engine has no room for.

    A remote engine admits or refuses (429/503) each stream itself: its refusal fails the part
    with the same words as the local refusal here.
    """
    if caps.over_cap(user.pk):
        refused = caps.OverCap()
        raise TurnRefused(429, refused.message, retry_after=refused.retry_after)
    if engine is None:
        raise TurnRefused(503, "The model is still loading; try again in a few seconds.", 5)
    if engine is model_runtime.remote:
        return
    stats = engine.stats()
    if stats.waiting >= engine.config.max_waiting:
        raise TurnRefused(429, "The engine is busy right now; try again in a few seconds.", 5)


def turn_create(
    user,
    conversation: Conversation | None,
    text: str,
    wants_image: bool,
    new_settings: dict | None = None,
) -> Message:
    """Write the user's message and the reply's ordered parts, then start both parts.

    With no `conversation`, the turn is a new conversation's first: the conversation is
    created in the same transaction, after the checks, so a refused or never-sent first
    message leaves no empty row behind; `new_settings` (validated by the caller, see
    `chat.conversations.settings_form`) replace its defaults. One transaction writes
    everything (text part at 0, image part at 1 when asked); only
    after it commits is the text submitted to the engine and the image task enqueued, so
    neither can race ahead of rows that do not exist yet. The reply comes back as the text's
    start left it (`history_truncated` set when old turns were dropped from the prompt).
    """
    text = text.strip()
    engine = current_engine()
    check_turn(user, text, engine)  # the common refusals, before queueing for the admission lock
    with log_ids_scope(), ADMISSION, transaction.atomic():
        caps.hold_user(user.pk)
        check_turn(user, text, engine)  # again: no other turn of this user is half-way now
        if conversation is None:
            conversation = Conversation.objects.create(owner=user, **(new_settings or {}))
        else:
            conversation = Conversation.objects.select_for_update().get(pk=conversation.pk)
        last = branches.leaf(conversation.pk)  # the end of the branch on screen
        asked = Message.objects.create(
            conversation=conversation,
            role=Message.Role.USER,
            parent=last,
            position=last.position + 1 if last else 0,
            text=text,
            wants_image=wants_image,
        )
        reply = reply_create(asked)
        bind_log_ids(message_id=reply.pk)  # until the scope ends, after the parts started
        parts = lay_out(reply, 1)
        if not conversation.title:
            conversation.title = text[:60]
        conversation.save()
        start_after_commit(engine, parts)
        transaction.on_commit(lambda: metrics.turn_created(wants_image))
    ids = {"message_id": reply.pk}
    log.info("turn: reply %s with parts %s", reply.pk, [part.pk for part in parts], extra=ids)
    return reply


def reply_create(asked: Message) -> Message:
    """The (empty) reply to the user message `asked`, right after it on its branch."""
    return Message.objects.create(
        conversation_id=asked.conversation_id,
        role=Message.Role.ASSISTANT,
        parent=asked,
        position=asked.position + 1,
        wants_image=asked.wants_image,
    )


def lay_out(reply: Message, version: int) -> list[Part]:
    """A version's parts, queued: the text at 0, and the image at 1 when the turn asked."""
    now = timezone.now()
    kinds = [Part.Kind.TEXT] + ([Part.Kind.IMAGE] if reply.wants_image else [])
    return [
        Part.objects.create(message=reply, version=version, index=i, kind=kind, queued_at=now)
        for i, kind in enumerate(kinds)
    ]


def start_after_commit(engine: Engine | RemoteEngine, parts: list[Part]) -> None:
    """Once the rows exist: the text into the engine, the image to a worker."""
    transaction.on_commit(lambda: text_start(engine, parts[0]))
    if len(parts) > 1:
        transaction.on_commit(lambda: image_enqueue(parts[1]))


def text_start(engine: Engine | RemoteEngine, part: Part) -> None:
    """Build the prompt and submit it; the writer thread streams the result.

    A local engine gets the prompt's token ids (old turns dropped to fit its context: then
    `part.message`, the caller's reply, gets `history_truncated` as saved); a remote one gets
    the turns as chat messages, and its server applies the template and the context limit.
    """
    # Imported here: they load torch, which Celery workers importing this module never need.
    from chat import text_stream
    from chat.sampling import chat_sampling
    from inference.engine import EngineError

    message = part.message
    conversation = Conversation.objects.get(pk=message.conversation_id)
    params = chat_sampling(conversation)
    system_prompt = conversation.effective_settings()["system_prompt"]
    remote = engine is model_runtime.remote
    if remote:
        prompt = history.messages(message, system_prompt)
    else:
        built = history.build(
            engine.tokenizer, message, engine.max_seq_len - params.max_new_tokens, system_prompt
        )
        prompt = built.token_ids
        if built.truncated:
            Message.objects.filter(pk=message.pk).update(history_truncated=True)
            message.history_truncated = True
    request_id = f"part-{part.pk}-{uuid.uuid4().hex[:8]}"
    started = part_transition(
        part.pk,
        Part.State.STREAMING,
        engine_request_id=request_id,
        stream_owner=heartbeat.OWNER,
        started_at=timezone.now(),
    )
    if started is None:
        return
    text_stream.writer.ensure_running()
    live_text.reset(part.pk)
    on_event = text_stream.writer.callback(started, message.conversation_id)
    if remote:
        engine.submit(prompt, params, on_event, request_id, affinity=conversation.pk)
        return
    try:
        engine.submit(prompt, params, on_event=on_event, request_id=request_id)
    except EngineError as exc:
        part_transition(
            part.pk,
            Part.State.FAILED,
            error=f"The engine refused this reply: {exc}",
            finished_at=timezone.now(),
        )


def reply_regenerate(user, message: Message) -> Message:
    """A new version of a finished reply: its parts laid out again (text, and an image when
    the turn asked for one) and started, the older versions kept.

    The new version is shown at once (`message.update` carries the whole reply), and the
    model's history for it is the conversation before it, as shown. Refused like a turn when
    the user or the engine has no room, and with 409 while the shown version is unfinished.
    """
    engine = current_engine()
    check_capacity(user, engine)
    with log_ids_scope(), ADMISSION, transaction.atomic():
        caps.hold_user(user.pk)
        check_capacity(user, engine)
        message = Message.objects.select_for_update().get(pk=message.pk)
        refuse_while_unfinished(message)
        bind_log_ids(message_id=message.pk)
        version = message.version_count() + 1
        parts = lay_out(message, version)
        message.shown_version = version
        message.history_truncated = False
        message.save(update_fields=["shown_version", "history_truncated"])
        transaction.on_commit(lambda: announce_message(message))
        start_after_commit(engine, parts)
    log.info(
        "regenerate: reply %s version %s", message.pk, version, extra={"message_id": message.pk}
    )
    return message


def reply_show_version(message: Message, version: int) -> Message:
    """Show (and give the model's history) another version of a reply; 409 while the shown
    one is unfinished, 404 for a version the reply never had."""
    with transaction.atomic():
        message = Message.objects.select_for_update().get(pk=message.pk)
        if not message.parts.filter(version=version).exists():
            raise TurnRefused(404, f"This reply has no version {version}.")
        refuse_while_unfinished(message)
        message.shown_version = version
        message.save(update_fields=["shown_version"])
        transaction.on_commit(lambda: announce_message(message))
    return message


def message_edit(user, message: Message, text: str) -> Message:
    """Edit a sent user message: a new branch from that point, the old one kept.

    The edited words become a sibling of `message` (same parent, same position) with a new
    reply whose parts are laid out again (text, and an image when the turn asked for one),
    and that branch is shown; the model's history for the reply is the branch up to it.
    Refused like a turn (422, 429, 503), and with 409 while any reply of the conversation is
    unfinished: stop it or wait for it first, so no hidden branch is ever still running.
    Returns the new reply; the open pages get `conversation.branch`.
    """
    text = text.strip()
    engine = current_engine()
    check_turn(user, text, engine)
    with log_ids_scope(), ADMISSION, transaction.atomic():
        check_turn(user, text, engine)
        conversation = Conversation.objects.select_for_update().get(pk=message.conversation_id)
        refuse_while_conversation_unfinished(conversation)
        original = Message.objects.get(pk=message.pk)
        parent_id, siblings = branches.fork(original)
        Message.objects.filter(pk__in=siblings).update(shown=False)
        edited = Message.objects.create(
            conversation=conversation,
            role=Message.Role.USER,
            parent_id=parent_id,
            position=original.position,
            text=text,
            wants_image=original.wants_image,
        )
        reply = reply_create(edited)
        bind_log_ids(message_id=reply.pk)
        parts = lay_out(reply, 1)
        conversation.save(update_fields=["updated_at"])
        transaction.on_commit(lambda: announce_branch(conversation.pk))
        start_after_commit(engine, parts)
        transaction.on_commit(lambda: metrics.turn_created(reply.wants_image))
    log.info(
        "edit: message %s branched as %s, reply %s",
        message.pk,
        edited.pk,
        reply.pk,
        extra={"message_id": reply.pk},
    )
    return reply


def message_show_branch(message: Message, branch: int) -> None:
    """Show another branch at the user message `message` (1 is its oldest version): the
    page and the model's history follow it. 409 while any reply of the conversation is
    unfinished, 404 for a branch that does not exist."""
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().get(pk=message.conversation_id)
        siblings = branches.fork(message)[1]
        if not 1 <= branch <= len(siblings):
            raise TurnRefused(404, f"This message has no branch {branch}.")
        refuse_while_conversation_unfinished(conversation)
        Message.objects.filter(pk__in=siblings).update(shown=False)
        Message.objects.filter(pk=siblings[branch - 1]).update(shown=True)
        transaction.on_commit(lambda: announce_branch(conversation.pk))


def refuse_while_conversation_unfinished(conversation: Conversation) -> None:
    unfinished = Part.objects.filter(
        message__conversation=conversation,
        state__in=[Part.State.QUEUED, Part.State.STREAMING, Part.State.RUNNING],
    )
    if unfinished.exists():
        raise TurnRefused(
            409, "A reply is still being made; stop it or wait for it, then change branches."
        )


def announce_branch(conversation_id: int) -> None:
    """Tell the conversation's browsers the branch now on screen, whole."""
    events.send(
        conversation_id,
        {"type": "conversation.branch", "messages": conversation_snapshot(conversation_id)},
    )


def refuse_while_unfinished(message: Message) -> None:
    unfinished = message.parts.filter(
        version=message.shown_version,
        state__in=[Part.State.QUEUED, Part.State.STREAMING, Part.State.RUNNING],
    )
    if unfinished.exists():
        raise TurnRefused(409, "This reply is still being made; stop it or wait for it.")


def announce_message(message: Message) -> None:
    """Tell the conversation's browsers the reply as it now stands (another version shown)."""
    fresh = Message.objects.prefetch_related("parts").get(pk=message.pk)
    events.send(
        message.conversation_id, {"type": "message.update", "message": message_payload(fresh)}
    )


def text_stop(message: Message) -> bool:
    """Stop the reply's text (the version on screen): cancel it in the engine (it ends
    `cancelled`, text kept)."""
    part = message.parts.filter(kind=Part.Kind.TEXT, version=message.shown_version).first()
    if part is None:
        return False
    if part.state == Part.State.QUEUED:
        stopped = part_transition(part.pk, Part.State.CANCELLED, finished_at=timezone.now())
        return stopped is not None
    engine = current_engine()
    if part.state != Part.State.STREAMING or engine is None:
        return False
    return engine.cancel(part.engine_request_id)


def message_stop(message: Message) -> None:
    """The stop button: cancel the text and a not-yet-finished image."""
    text_stop(message)
    images = message.parts.filter(
        kind=Part.Kind.IMAGE, state__in=[Part.State.QUEUED, Part.State.RUNNING]
    )
    for part in images:
        image_cancel(part)


def part_mark_failed(part: Part, reason: str) -> Part | None:
    """An operator's verdict on a part that will not finish by itself: fail it now.

    A text part keeps the text its browser was shown (the saved text plus the live tail),
    and a streaming one also has its engine request cancelled in this process, so the engine
    stops spending steps on it; the stream's own final move is then refused by the state
    machine. A running image's worker stops at its next progress report. Returns None when
    the part had already finished.
    """
    fields: dict = {"error": reason, "finished_at": timezone.now()}
    if part.kind == Part.Kind.TEXT:
        current = Part.objects.filter(pk=part.pk).first()
        if current is not None:
            fields["text"], fields["seq"] = live_text.streamed(current)
    failed = part_transition(part.pk, Part.State.FAILED, **fields)
    if failed is None:
        return None
    if failed.kind == Part.Kind.TEXT and failed.engine_request_id:
        engine = current_engine()
        if engine is not None:
            engine.cancel(failed.engine_request_id)
        live_text.expire(failed.pk)
    return failed
