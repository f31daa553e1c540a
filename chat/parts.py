"""The Part service at the bottom of the chat: every change to a part's row goes through here.

A state change is saved and then announced to the conversation's browsers, so the database
and the UI never disagree. The chat's text stream, the media app (enqueue, render, sweep) and
the admin all use these; none of them writes a Part's state or progress by hand.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from chat import events, metrics
from chat.models import Part
from chat.states import TERMINAL, can_transition

log = logging.getLogger(__name__)


def part_transition(
    part_id: int, target: str, *, expect: str | None = None, **fields
) -> Part | None:
    """Move a part to `target` if its state machine allows it, saving `fields` with it.

    The row is locked for the check, so two concurrent callers (a redelivered task, a sweeper,
    a user's retry) never both win: the loser gets None and changes nothing. `expect` makes
    the move conditional on the state the caller saw, for moves like running → running that
    two callers could otherwise both make. Only the state, `updated_at` and `fields` are
    written, so a misspelt field raises instead of being silently dropped. After commit the
    new part state and the message's derived status go to the browser.
    """
    with transaction.atomic():
        part = Part.objects.select_for_update().filter(pk=part_id).first()
        if part is None or not can_transition(part.kind, part.state, target):
            return None
        if expect is not None and part.state != expect:
            return None
        previous = part.state
        part.state = target
        for name, value in fields.items():
            setattr(part, name, value)
        part.save(update_fields=["state", "updated_at", *fields])
        transaction.on_commit(lambda: announce(part))
        if target in TERMINAL:
            transaction.on_commit(lambda: metrics.part_finished(part))
    ids = {"part_id": part.pk, "message_id": part.message_id}
    log.info("part %s %s: %s -> %s", part.pk, part.kind, previous, target, extra=ids)
    return part


def part_update(part: Part, *, streaming_only: bool = False, **fields) -> None:
    """Save non-state fields (text so far, first token time) of a part; nobody is told.
    `streaming_only` skips a part that is no longer streaming (its final save has the text)."""
    for name, value in fields.items():
        setattr(part, name, value)
    rows = Part.objects.filter(pk=part.pk)
    if streaming_only:
        rows = rows.filter(state=Part.State.STREAMING)
    rows.update(**fields, updated_at=timezone.now())


def parts_update(changes: list[tuple[Part, dict]], *, streaming_only: bool = False) -> int:
    """Save non-state fields of many parts at once (the text writer's text so far); nobody is
    told. Returns the rows written: a part deleted meanwhile is skipped, not an error, and with
    `streaming_only` so is one that ended meanwhile (its final save carries the whole text).

    One UPDATE with a CASE per field for as many parts as the database's parameter limit
    allows (SQLite's 999: about 200 parts of text and seq; PostgreSQL: all), all in one
    transaction: a save per part was a statement and a commit (an fsync on SQLite) per part
    and interval, which at hundreds of replies kept the writer waiting on the disk. The SQL
    is written here rather than by the ORM's Case/When, whose expressions for 200 parts took
    a fifth of a core at two saves a second.
    """
    if not changes:
        return 0
    quote = connection.ops.quote_name
    meta = Part._meta
    names = sorted({name for _, fields in changes for name in fields})
    columns = {name: meta.get_field(name) for name in names}
    limit = connection.features.max_query_params or 65535
    size = max(1, (limit - 2) // (1 + 2 * len(names)))  # IN's id, a WHEN's id and value each
    now = timezone.now()
    written = 0
    with transaction.atomic(), connection.cursor() as cursor:
        for start in range(0, len(changes), size):
            batch = changes[start : start + size]
            sets, params = [], []
            for name, field in columns.items():
                column = quote(field.column)
                whens = []
                for part, fields in batch:
                    if name in fields:
                        whens.append("WHEN %s THEN %s")
                        params += [part.pk, field.get_db_prep_save(fields[name], connection)]
                if whens:  # a field no part of this batch carries is left alone
                    cases = " ".join(whens)
                    sets.append(f"{column} = CASE {quote('id')} {cases} ELSE {column} END")
            sets.append(f"{quote('updated_at')} = %s")
            params.append(meta.get_field("updated_at").get_db_prep_save(now, connection))
            ids = [part.pk for part, _ in batch]
            params += ids
            where = f"{quote('id')} IN ({', '.join(['%s'] * len(ids))})"
            if streaming_only:
                where += f" AND {quote('state')} = %s"
                params.append(Part.State.STREAMING)
            sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {where}"
            cursor.execute(sql, params)
            written += cursor.rowcount
    for part, fields in changes:
        for name, value in fields.items():
            setattr(part, name, value)
    return written


def part_progress(part: Part, fraction: float) -> bool:
    """Save and announce a running part's progress; False when it is no longer running.

    The write is conditional on the state, which is how a cancel (or the sweeper's verdict)
    reaches a worker mid-render: its next report finds the part changed.
    """
    fraction = min(max(fraction, 0.0), 1.0)
    still_running = Part.objects.filter(pk=part.pk, state=Part.State.RUNNING).update(
        progress=fraction, updated_at=timezone.now()
    )
    if not still_running:
        return False
    part.progress = fraction
    events.send(part.message.conversation_id, events.part_state_event(part))
    return True


def announce(part: Part) -> None:
    """Tell the conversation's browsers a part's state and its message's status."""
    conversation_id = part.message.conversation_id
    events.send(conversation_id, events.part_state_event(part))
    shown = Part.objects.filter(
        message_id=part.message_id, version=F("message__shown_version")
    ).values_list("state", flat=True)
    states = list(shown)
    events.send(conversation_id, events.message_state_event(part.message_id, states))
