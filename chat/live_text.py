"""The live tail of streaming text parts, kept in Redis between database saves.

Every piece is appended to a per-part Redis list before the delta carrying it is broadcast,
so a browser that (re)connects can rebuild the text exactly: the saved text (seq N) from the
database, then list items N+1.. from here, then the live events it receives after joining
its conversation's channel; a reader that sees a gap in the seqs mends it from here.
When Redis is unreachable the tail is skipped, never the text: the writer keeps streaming
into the database, and a reconnecting client then gets the last saved text.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from config.redis_client import redis_client

if TYPE_CHECKING:
    from chat.models import Part

log = logging.getLogger(__name__)
KEY = "tandem:part-deltas:{}"
# After the end the whole text is saved with its seq, so the tail only serves a page that
# reconnects within moments (one that comes later gets the saved text: `chat.resume`). An
# hour kept every finished reply's tail in Redis: the soak saw the keys grow all run long.
TTL_AFTER_FINISH = 120


def _quietly(action: str, part_id: int, call) -> object:
    """The call's result, or None when Redis failed (logged, never raised)."""
    try:
        return call(redis_client())
    except redis.RedisError as exc:
        log.warning("live tail %s of part %s skipped: %s", action, part_id, exc)
        return None


def reset(part_id: int) -> None:
    """Start a part's tail afresh (a tail left by an earlier database with this id goes)."""
    _quietly("reset", part_id, lambda r: r.delete(KEY.format(part_id)))


def append(part_id: int, *pieces: str) -> bool:
    """Record the next pieces of a part (item n is piece n); False when Redis did not take them."""
    return _quietly("append", part_id, lambda r: r.rpush(KEY.format(part_id), *pieces)) is not None


def append_in(pipe: redis.client.Pipeline, part_id: int, pieces: list[str]) -> None:
    """Queue the next pieces of a part on `pipe` (the writer sends many parts' at once)."""
    pipe.rpush(KEY.format(part_id), *pieces)


def rebuild(part_id: int, pieces: list[str]) -> bool:
    """Replace a part's tail with all its deltas, in one transaction; False when Redis failed.

    After appends were skipped (Redis down, or restarted empty), item n would no longer be
    delta n; the writer, which kept every piece, puts the whole tail back before appending.
    """

    def replace(r: redis.Redis) -> list:
        pipe = r.pipeline(transaction=True).delete(KEY.format(part_id))
        if pieces:
            pipe.rpush(KEY.format(part_id), *pieces)
        return pipe.execute()

    return _quietly("rebuild", part_id, replace) is not None


def expire(part_id: int) -> None:
    """The part is final and saved whole: let its tail go after a while."""
    _quietly("expire", part_id, lambda r: r.expire(KEY.format(part_id), TTL_AFTER_FINISH))


def tail(part_id: int, after_seq: int) -> list[str]:
    """Deltas after `after_seq` (1-based sequence numbers); empty when Redis is away."""
    items = _quietly("read", part_id, lambda r: r.lrange(KEY.format(part_id), after_seq, -1))
    return [item.decode() for item in items or []]


def streamed(part: Part) -> tuple[str, int]:
    """All the text a browser was shown and its seq: the saved text plus the tail after it."""
    pieces = tail(part.pk, part.seq)
    return part.text + "".join(pieces), part.seq + len(pieces)
