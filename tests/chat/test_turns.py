"""turn_create and the text stream, with the real engine in this process and the real Redis."""

import pytest
from django.test import override_settings

from chat import live_text, services
from chat.models import Message, Part
from tests.support.processes import wait_until

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


def wait_final(part: Part, timeout: float = 120) -> Part:
    wait_until(
        lambda: Part.objects.get(pk=part.pk).state not in (Part.State.QUEUED, Part.State.STREAMING),
        timeout,
        "the text part to finish",
    )
    return Part.objects.get(pk=part.pk)


@override_settings(TANDEM_CHAT_TEMPERATURE=0, TANDEM_CHAT_MAX_NEW_TOKENS=24)
def test_turn_writes_ordered_parts_and_streams_the_text(alice, conversation, engine_in_process):
    reply = services.turn_create(alice, conversation, "What is the capital of France?", False)
    user_message = Message.objects.get(conversation=conversation, position=0)
    assert user_message.role == "user" and reply.position == 1
    [text_part] = reply.parts.all()
    assert (text_part.index, text_part.kind) == (0, "text")
    final = wait_final(text_part)
    assert final.state == Part.State.SUCCEEDED
    assert "Paris" in final.text
    assert final.seq == len(live_text.tail(final.pk, 0)) > 0
    assert "".join(live_text.tail(final.pk, 0)) == final.text
    assert final.prompt_tokens > 10 and 0 < final.completion_tokens <= 24
    assert final.first_token_at and final.finished_at and final.started_at
    assert conversation.__class__.objects.get(pk=conversation.pk).title.startswith("What is")


@override_settings(TANDEM_CHAT_TEMPERATURE=0, TANDEM_CHAT_MAX_NEW_TOKENS=300)
def test_stop_keeps_the_text(alice, conversation, engine_in_process):
    reply = services.turn_create(alice, conversation, "Write a long story about a dragon.", False)
    part = reply.parts.get()
    wait_until(lambda: len(live_text.tail(part.pk, 0)) >= 5, 60, "some text")
    services.message_stop(reply)
    final = wait_final(part)
    assert final.state == Part.State.CANCELLED
    assert final.finish_reason == "cancelled"
    assert final.text and final.text == "".join(live_text.tail(part.pk, 0))
    assert final.completion_tokens < 300


def test_refusals_come_before_anything_is_written(alice, conversation, engine_in_process):
    with pytest.raises(services.TurnRefused) as empty:
        services.turn_create(alice, conversation, "   ", False)
    assert empty.value.status == 422
    with (
        override_settings(TANDEM_MAX_MESSAGE_CHARS=10),
        pytest.raises(services.TurnRefused) as long,
    ):
        services.turn_create(alice, conversation, "x" * 11, False)
    assert long.value.status == 422 and "limit is 10" in long.value.message
    assert not Message.objects.exists()


@override_settings(TANDEM_MAX_TURNS_IN_FLIGHT=1, TANDEM_CHAT_MAX_NEW_TOKENS=200)
def test_per_user_cap_on_turns_in_flight(alice, conversation, engine_in_process):
    reply = services.turn_create(alice, conversation, "Tell me about the moon.", False)
    with pytest.raises(services.TurnRefused) as refused:
        services.turn_create(alice, conversation, "And the sun?", False)
    assert refused.value.status == 429
    services.message_stop(reply)
    wait_final(reply.parts.get())


def test_no_engine_is_a_503(alice, conversation):
    with pytest.raises(services.TurnRefused) as refused:
        services.turn_create(alice, conversation, "Hello", False)
    assert refused.value.status == 503


@override_settings(TANDEM_CHAT_TEMPERATURE=0, TANDEM_CHAT_MAX_NEW_TOKENS=8)
def test_long_history_drops_the_oldest_turns(alice, conversation, engine_in_process):
    engine_in_process_max = engine_in_process.max_seq_len
    long_text = "history " * 700
    for position in range(0, 6, 2):
        Message.objects.create(
            conversation=conversation, role="user", position=position, text=long_text
        )
        reply = Message.objects.create(
            conversation=conversation, role="assistant", position=position + 1
        )
        Part.objects.create(message=reply, index=0, kind="text", state="succeeded", text="ok")
    assert engine_in_process_max == 2048
    reply = services.turn_create(alice, conversation, "Summarise.", False)
    final = wait_final(reply.parts.get())
    assert final.state == Part.State.SUCCEEDED
    assert Message.objects.get(pk=reply.pk).history_truncated
    assert final.prompt_tokens <= 2048 - 8


@override_settings(TANDEM_CHAT_TEMPERATURE=0, TANDEM_CHAT_MAX_NEW_TOKENS=12)
def test_text_still_streams_to_the_database_when_redis_is_unreachable(
    alice, conversation, engine_in_process
):
    from tests.support.processes import free_port

    with override_settings(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"):
        reply = services.turn_create(alice, conversation, "What is the capital of France?", False)
        final = wait_final(reply.parts.get())
    assert final.state == Part.State.SUCCEEDED
    assert "Paris" in final.text and final.seq > 0
