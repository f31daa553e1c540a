"""Tandem across a real network: two web hosts, a worker host, an engine host, Redis and
PostgreSQL on the bridge, Chromium in the root namespace (tests/deploy/conftest.py,
docs/deploy.md).

What a single-machine test cannot show: the channel layer, the live text tail, the heartbeats
and the remote engine's stream really cross hosts. A reply streamed by web host A is followed
live by a tab on web host B; when A dies mid-stream, B keeps serving while the worker host's
sweeper closes A's parts as interrupted with the text they had; when the engine host dies, the
web host's part ends interrupted, the next turn fails saying why, and a restarted engine host
serves again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from functools import partial
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import Page, expect

from chat.models import Conversation, Part
from media.models import SweeperAction
from media.sweeper import TEXT_ORPHANED
from tests.chaos.conftest import Visitor, make_visitor, seconds_between, wait_terminal
from tests.chat_ui.conftest import Chat
from tests.deploy.conftest import HEARTBEAT_TTL, SUMMARIES, WebHost, side_by_side
from tests.support.network import Host
from tests.support.processes import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("orm_on_stack")]

PROMPT = "Tell me about lighthouses."
INTERRUPT_BOUND = HEARTBEAT_TTL + 15.0  # seconds from the kill until A's parts are interrupted


def open_on(page: Page, web: WebHost, visitor: Visitor, conversation: Conversation) -> Chat:
    """The conversation's page served by `web`, its socket open."""
    page.context.add_cookies(visitor.browser_cookies(web))
    page.goto(f"{web.url}/c/{conversation.pk}/")
    expect(page.locator("#connection")).to_have_attribute("data-connection", "open")
    return Chat(page, web.url, visitor.user)


def owned_by(part: Part, web: WebHost) -> bool:
    """Whether `web`'s process streamed the part (its heartbeat owner is host:pid:nonce)."""
    return f":{web.service.pid}:" in part.stream_owner


REACH = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(2)
        print(target, sock.connect_ex((host, int(port))) == 0)
"""


def reachable_from(host: Host, *targets: str) -> dict[str, bool]:
    """Which host:port targets accept a TCP connection from a process on `host`."""
    argv = host.command([sys.executable, "-c", REACH, *targets])
    output = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    return {line.split()[0]: line.split()[1] == "True" for line in output.splitlines()}


def test_the_hosts_reach_each_other_over_the_bridge_and_not_the_machines_loopback(stack, web_b):
    if not stack.topology.namespaced:
        pytest.skip(f"no network namespaces here: {stack.topology.fallback_reason}")
    redis_port = urlsplit(settings.REDIS_URL).port or 6379
    targets = [
        f"{stack.topology.service_address}:{stack.redis.port}",
        f"{stack.topology.service_address}:{stack.postgres.port}",
        f"{web_b.host.address}:{web_b.port}",
        f"127.0.0.1:{redis_port}",  # the machine's own Redis: not on this host's network
    ]
    seen = reachable_from(stack.host("worker"), *targets)
    assert seen == dict(zip(targets, [True, True, True, False], strict=True)), seen


def test_a_turn_on_web_host_a_is_followed_live_in_a_tab_on_web_host_b(web_a, web_b, page):
    visitor = make_visitor("topology")
    conversation = visitor.conversation()
    writer = open_on(page, web_a, visitor, conversation)
    follower = open_on(page.context.new_page(), web_b, visitor, conversation)
    follower.record()

    writer.send(PROMPT)
    part_id = writer.part_id(writer.text_part)
    follower.wait_text(40)
    assert writer.wait_final(writer.text_part) == "succeeded"
    assert follower.wait_final(follower.text_part) == "succeeded"

    part = Part.objects.get(pk=part_id)
    assert owned_by(part, web_a), part.stream_owner
    assert part.text and writer.raw_text(part_id) == part.text
    assert follower.raw_text(part_id) == part.text
    growing = [
        len(sample["raw"] or "")
        for sample in follower.samples()
        if sample["id"] == part_id and sample["state"] == "streaming"
    ]
    # Live: B's tab drew the text piece by piece while A was still streaming it.
    assert len(set(growing)) >= 5 and growing == sorted(growing), growing
    assert min(growing) < len(part.text) // 2, growing
    SUMMARIES.append(
        f"live follow: a {len(part.text)}-character reply streamed by {web_a.host.address} "
        f"drawn in {len(set(growing))} steps by a tab on {web_b.host.address}"
    )


def test_web_host_a_killed_mid_stream_b_keeps_serving_and_the_sweeper_interrupts_as_parts(
    web_a, web_b, page
):
    visitors = [make_visitor("topology") for _ in range(2)]
    conversations = [visitor.conversation() for visitor in visitors]
    writer = open_on(page, web_a, visitors[0], conversations[0])
    follower = open_on(page.context.new_page(), web_b, visitors[0], conversations[0])
    writer.send(PROMPT)
    status, _, body = visitors[1].post_turn(web_a, conversations[1], PROMPT)
    assert status == 201, body
    parts = [writer.part_id(writer.text_part), body["reply"]["parts"][0]["id"]]
    follower.wait_text(40)
    wait_until(
        lambda: Part.objects.filter(pk__in=parts, state="streaming", seq__gt=0).count() == 2,
        30,
        "both of A's replies to be streaming",
    )

    seen = follower.raw_text(parts[0])
    web_a.service.kill(signal.SIGKILL)
    killed_at, killed = timezone.now(), time.monotonic()
    wait_terminal(parts, INTERRUPT_BOUND, "the sweeper to interrupt A's replies")
    shown = follower.page.locator(f'[data-part-id="{parts[0]}"]')
    expect(shown).to_have_attribute("data-state", "interrupted", timeout=15_000)
    page_showed = time.monotonic() - killed

    final = list(Part.objects.filter(pk__in=parts).order_by("pk"))
    assert [part.state for part in final] == [Part.State.INTERRUPTED] * 2
    assert all(part.error == TEXT_ORPHANED and part.text for part in final)
    assert all(owned_by(part, web_a) for part in final)
    assert final[0].text.startswith(seen) and follower.raw_text(parts[0]) == final[0].text
    swept = SweeperAction.objects.filter(part__in=parts, action=SweeperAction.Action.INTERRUPTED)
    assert swept.count() == 2
    to_interrupted = [seconds_between(killed_at, part.finished_at) for part in final]

    # B never depended on A: the same tab sends the next turn there, and it streams to the end.
    follower.send("And about harbours?")
    assert follower.wait_final(follower.text_part) == "succeeded"
    after = Part.objects.get(pk=follower.part_id(follower.text_part))
    assert after.text and owned_by(after, web_b)
    SUMMARIES.append(
        f"web host A killed with 2 replies streaming: both interrupted with their text "
        f"({[len(p.text) for p in final]} characters) {max(to_interrupted):.1f} s after the "
        f"kill (heartbeat TTL {HEARTBEAT_TTL} s); B's tab showed it after {page_showed:.1f} s "
        f"and B served the next turn"
    )


ENGINE_KEY = "topology-engine-key"
ENGINE_HOST = {
    "TANDEM_ROLE": "engine",
    "TANDEM_API_KEYS": ENGINE_KEY,
    "TANDEM_ENGINE_SOURCE": "synthetic",
    "TANDEM_SYNTHETIC_TOKENS_PER_S": "20",
}


def test_the_engine_host_killed_mid_stream_then_down_then_back(stack, hosts, started, page):
    engine_host = stack.host("engine")
    port = engine_host.port()
    # Side by side: a web process with remote engines is ready without them (docs/deploy.md).
    engine, web = side_by_side(
        partial(started, "engine", "daphne-engine", port=port, **ENGINE_HOST),
        partial(
            started,
            "web-a",
            "daphne-web-a-remote",
            TANDEM_ENGINE=f"http://{engine_host.address}:{port}",
            TANDEM_ENGINE_API_KEY=ENGINE_KEY,
            TANDEM_CHAT_MAX_NEW_TOKENS="80",
            TANDEM_ENGINE_STALL_TIMEOUT="10",
        ),
    )
    visitor = make_visitor("topology")
    chat = open_on(page, web, visitor, visitor.conversation())

    chat.send(PROMPT)
    chat.wait_text(40)
    dropped = chat.part_id(chat.text_part)
    seen = chat.raw_text(dropped)
    engine.service.kill(signal.SIGKILL)
    killed = time.monotonic()
    assert chat.wait_final(chat.text_part, timeout=30_000) == "interrupted"
    page_showed = time.monotonic() - killed
    part = Part.objects.get(pk=dropped)
    assert part.state == Part.State.INTERRUPTED and part.text.startswith(seen), part.text
    assert "dropped" in part.error or "ended before the reply did" in part.error, part.error
    assert chat.raw_text(dropped) == part.text

    # With its engine down, the next turn fails at once and says why, on the page too.
    chat.send("Are you still there?")
    assert chat.wait_final(chat.text_part, timeout=30_000) == "failed"
    refused = Part.objects.get(pk=chat.part_id(chat.text_part))
    assert "no engine could take this reply" in refused.error, refused.error
    assert engine.host.address in refused.error, refused.error
    expect(chat.text_part.locator(".part-status")).to_contain_text("no engine could take")

    # The engine host comes back at the same address: the next turn streams from it again.
    back = started("engine", "daphne-engine-restarted", port=engine.port, **ENGINE_HOST)
    chat.send("And now?")
    assert chat.wait_final(chat.text_part) == "succeeded"
    answered = Part.objects.get(pk=chat.part_id(chat.text_part))
    assert answered.text and back.service.alive()
    SUMMARIES.append(
        f"engine host {engine.host.address} killed mid-stream: the part interrupted with "
        f"{len(part.text)} characters kept, shown after {page_showed:.1f} s; the next turn "
        f"failed with {refused.error!r}; after the restart a turn streamed "
        f"{len(answered.text)} characters"
    )
