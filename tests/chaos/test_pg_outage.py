"""PostgreSQL stops for 30 s while replies stream; they keep streaming, and all is saved after.

The scenario runs its own PostgreSQL cluster (tests/support/postgres.py) and points a Daphne
and a worker with beat at it. Four long replies are streaming, each read over SSE from before
the stop to its end and one also watched in Chromium, when the cluster gets a fast shutdown
(every connection cut, as in a crash). During the outage the replies keep reaching their
readers (the text writer keeps the text, `chat/text_stream.py`), a turn is answered 503 with a
JSON reason at once (`config/postgres`'s gate, `config/database_unavailable.py`), so is a
turn sent from the page, which shows the reason as its notice, and the chat page itself; the
API, which needs no database, still answers 200. After the restart, every text part is final
with exactly the text its reader put together from the deltas, the page and a new turn work
again, and no process died or answered 500.
"""

from __future__ import annotations

import re
import threading
import time

from django.db import connections
from django.utils import timezone
from playwright.sync_api import expect

from chat.models import Part
from tests.chaos import conftest as chaos
from tests.chat_ui.conftest import Chat
from tests.conftest import start_daphne, wait_for_model
from tests.support.http import get, post_json
from tests.support.media import start_worker
from tests.support.processes import wait_until
from tests.support.reply_reader import StreamedText, StreamRefused, open_stream, read_stream

pytestmark = chaos.BROWSER_SCENARIO

OUTAGE = 30.0  # seconds without PostgreSQL
REPLIES = 4  # long replies streaming when it stops
MAX_NEW_TOKENS = "600"  # long replies outlast the outage (greedy, they run to this cap)
RECOVERY_BOUND = 240.0  # seconds from PostgreSQL being back until every part must be final
FAST_REFUSAL = 5.0  # seconds a request may take to be refused while the database is down
PROMPT = "Write a long story about a lighthouse keeper and a storm, in many paragraphs."
SHORT = "Name five fruits, one per line."  # sent just before the stop: it ends during it
UNAVAILABLE = "The database is unavailable"


def test_postgres_stopped_30_s_while_replies_stream(
    service_logs, private_postgres, private_redis, page, tmp_path
):
    env = chaos.outage_env(private_redis, tmp_path)
    # Greedy: the short reply's length (about 25 tokens) does not vary from run to run.
    tokens = {"TANDEM_CHAT_MAX_NEW_TOKENS": MAX_NEW_TOKENS, "TANDEM_CHAT_TEMPERATURE": "0"}
    server = start_daphne("daphne-pg-outage", service_logs, **tokens, **env, **chaos.SERVER_ENV)
    worker = start_worker(service_logs, beat_schedule=tmp_path / "beat", **env)
    try:
        wait_for_model(server)
        visitors = [chaos.make_visitor("pg-outage") for _ in range(REPLIES + 2)]
        conversations = [visitor.conversation() for visitor in visitors]
        page.context.add_cookies(visitors[0].browser_cookies(server))
        page.goto(f"{server.url}/c/{conversations[0].pk}/")
        chat = Chat(page, server.url, visitors[0].user)
        expect(page.locator("#connection")).to_have_attribute("data-connection", "open")

        replies = []

        def send(number: int, text: str) -> None:
            status, _, body = visitors[number].post_turn(server, conversations[number], text)
            assert status == 201, body
            replies.append(body["reply"])
            readers.append(StreamedText(body["reply"]["parts"][0]["id"]))

        readers: list[StreamedText] = []
        errors: list[str] = []

        def read(number: int) -> None:
            """To the reply's end; a missed delta resumes from the last one held, and a
            resume refused while the database is down is tried again every half second."""
            cookie, message_id = visitors[number].cookie_header, replies[number]["id"]
            seen, last_event_id = readers[number], None
            deadline = time.monotonic() + OUTAGE + 2 * RECOVERY_BOUND
            try:
                while time.monotonic() < deadline:
                    try:
                        stream = open_stream(server.port, cookie, message_id, last_event_id)
                    except StreamRefused:
                        time.sleep(0.5)
                        continue
                    with stream:
                        if read_stream(stream, seen, resync=True):
                            return
                    last_event_id = seen.seq
                errors.append(f"reader {number}: the reply had not ended")
            except (OSError, ValueError) as exc:
                errors.append(f"reader {number}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=read, args=(n,), daemon=True) for n in range(REPLIES)]
        for number in range(REPLIES):
            send(number, PROMPT)
            threads[number].start()
        wait_until(
            lambda: all(reader.seq >= 5 for reader in readers), 120, "every reply to be streaming"
        )
        send(REPLIES, SHORT)
        threads.append(threading.Thread(target=read, args=(REPLIES,), daemon=True))
        threads[-1].start()
        wait_until(lambda: readers[-1].seq >= 1, 60, "the short reply's reader to be reading")
        text_ids = [reader.part_id for reader in readers]
        connections["default"].close()  # this process's own connection dies with the server
        shown_at_stop = len(chat.raw_text(text_ids[0]))
        private_postgres.stop()
        stopped, stopped_at = time.monotonic(), timezone.now()

        # During the outage: a turn, the page and the API, each timed.
        started = time.monotonic()
        spare, spare_conversation = visitors[-1], conversations[-1]
        turn_status, turn_headers, turn_body = spare.post_turn(server, spare_conversation, "Hi?")
        turn_seconds = time.monotonic() - started
        cookie, spare_page = spare.cookie_header, f"{server.url}/c/{spare_conversation.pk}/"
        started = time.monotonic()
        page_status, _, page_body = get(spare_page, {"Cookie": cookie})
        page_seconds = time.monotonic() - started
        api = {"model": "tandem", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        api_status, _, _ = post_json(f"{server.url}/v1/chat/completions", api, timeout=120)
        chat.send("Are you there?", drawn=False)
        notice = page.locator("#composer-notice")
        expect(notice).to_contain_text(UNAVAILABLE, timeout=15_000)
        notice_words = notice.text_content()
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped)))
        shown_at_restart = len(chat.raw_text(text_ids[0]))
        deltas_during = sum(sum(stopped <= t for t in reader.arrivals) for reader in readers)
        outage = time.monotonic() - stopped
        private_postgres.start()
        back_at = timezone.now()

        for thread in threads:
            thread.join(RECOVERY_BOUND)
        chaos.wait_terminal(text_ids, RECOVERY_BOUND, "every text part to end after the restart")
        after_page, _, _ = get(spare_page, {"Cookie": cookie})
        after_turn, _, after_body = spare.post_turn(server, spare_conversation, "Hello again.")
        assert after_turn == 201, after_body
        later = after_body["reply"]
        post_json(
            f"{server.url}/m/{later['id']}/stop",
            {},
            {"Cookie": cookie, "X-CSRFToken": spare.csrf},
        )
        chaos.wait_terminal([later["parts"][0]["id"]], 60, "the turn sent after the restart to end")
        expect(page.locator(f'[data-part-id="{text_ids[0]}"]')).to_have_attribute(
            "data-state", re.compile("^(succeeded|failed|cancelled|interrupted)$"), timeout=30_000
        )
        shown_final = chat.raw_text(text_ids[0])
        assert server.service.alive() and worker.service.alive()
    finally:
        server.service.stop()
        worker.service.stop()
    web_log = server.service.log_path.read_text(errors="replace")
    worker_log = worker.service.log_path.read_text(errors="replace")

    saved = {part.pk: part for part in Part.objects.filter(pk__in=text_ids)}
    mismatched = [
        r.part_id
        for r in readers
        if r.gaps or r.text != saved[r.part_id].text or r.seq != saved[r.part_id].seq
    ]
    ended_during = [p for p in saved.values() if p.finished_at and p.finished_at < back_at]
    last_final = max(chaos.seconds_between(back_at, p.finished_at) for p in saved.values())
    # A part that ended during the outage: how long after the restart its final save went in.
    late_saves = [chaos.seconds_between(back_at, p.updated_at) for p in ended_during]
    server_errors = len(re.findall(r'" 5\d\d ', web_log)) - len(re.findall(r'" 503 ', web_log))
    figures = chaos.record_figures(
        "pg_outage",
        f"PostgreSQL down {outage:.0f} s while {len(readers)} replies streamed: {deltas_during} "
        f"deltas reached the readers during it, the page's reply grew from {shown_at_stop} to "
        f"{shown_at_restart} characters; a turn got {turn_status} in {turn_seconds:.2f} s, the "
        f"page {page_status} in {page_seconds:.2f} s, the API {api_status}; after the restart "
        f"{len(readers) - len(mismatched)}/{len(readers)} saved texts equal the streamed ones "
        f"({len(ended_during)} had ended during the outage, saved {max(late_saves, default=0):.1f} "
        f"s after the restart), the last one final {last_final:.1f} s after it; 0 processes died",
        outage_seconds=round(outage, 1),
        replies_streaming_at_stop=len(readers),
        deltas_received_during_outage=deltas_during,
        page_reply_characters={"at_stop": shown_at_stop, "at_restart": shown_at_restart},
        turn_during_outage={"status": turn_status, "seconds": round(turn_seconds, 2)},
        page_during_outage={"status": page_status, "seconds": round(page_seconds, 2)},
        api_during_outage_status=api_status,
        page_notice_during_outage=notice_words,
        text_parts_ended_during_outage=len(ended_during),
        text_parts_ended_after_restart=len(saved) - len(ended_during),
        their_final_saves_after_restart_seconds=[round(s, 2) for s in late_saves],
        text_parts_by_state={p.pk: p.state for p in saved.values()},
        saved_text_differs_from_streamed=mismatched,
        readers={
            r.part_id: {
                "seq": r.seq,
                "saved_seq": saved[r.part_id].seq,
                "characters": len(r.text),
                "saved_characters": len(saved[r.part_id].text),
                "gaps": r.gaps,
                "resyncs": r.resyncs,
            }
            for r in readers
        },
        final_saves_deferred=web_log.count("final save deferred"),
        seconds_until_last_text_final_after_restart=round(last_final, 2),
        page_after_restart_status=after_page,
        turn_after_restart_status=after_turn,
        server_errors_other_than_503=server_errors,
        tracebacks_in_logs=web_log.count("Traceback") + worker_log.count("Traceback"),
        reader_errors=errors,
        stopped_at=stopped_at.isoformat(),
    )
    assert errors == []
    assert turn_status == 503 and UNAVAILABLE in turn_body["error"], turn_body
    assert turn_headers.get("Retry-After") == "5"
    assert turn_seconds <= FAST_REFUSAL and page_seconds <= FAST_REFUSAL
    assert page_status == 503 and UNAVAILABLE in page_body
    assert api_status == 200
    assert UNAVAILABLE in notice_words
    assert deltas_during > 0 and shown_at_restart > shown_at_stop
    assert all(p.state in chaos.FINAL for p in saved.values())
    assert ended_during and figures["final_saves_deferred"] >= 1
    assert mismatched == [], figures
    assert shown_final == saved[text_ids[0]].text
    assert after_page == 200
    assert server_errors == 0
