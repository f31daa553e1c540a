"""Per-conversation settings: defaults from settings, validation in words, applied to the reply."""

import pytest
from django.test import Client, override_settings

from chat import conversations, history, services
from chat.models import Conversation, Part
from chat.sampling import chat_sampling
from tests.support.media import EventTap
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@override_settings(
    TANDEM_CHAT_SYSTEM_PROMPT="Be brief.",
    TANDEM_CHAT_TEMPERATURE=0.5,
    TANDEM_CHAT_TOP_P=0.8,
    TANDEM_CHAT_MAX_NEW_TOKENS=100,
    TANDEM_CHAT_IMAGE_BY_DEFAULT=True,
    TANDEM_CHAT_REPETITION_PENALTY=1.2,
)
def test_a_new_conversation_takes_the_defaults_from_settings(alice):
    conversation = Conversation.objects.create(owner=alice)
    assert conversations.conversation_fields(conversation)["settings"] == {
        "system_prompt": "Be brief.",
        "temperature": 0.5,
        "top_p": 0.8,
        "max_new_tokens": 100,
        "image_by_default": True,
    }
    params = chat_sampling(conversation)
    assert (params.temperature, params.top_p, params.max_new_tokens) == (0.5, 0.8, 100)
    assert params.do_sample and params.repetition_penalty == 1.2
    page = client_for(alice).get(f"/c/{conversation.pk}/").content.decode()
    assert 'name="image" checked' in page  # the composer's switch starts on


@pytest.mark.parametrize(
    ("given", "field", "words"),
    [
        ({"temperature": 2.5}, "temperature", "Temperature must be between 0 and 2."),
        ({"temperature": -1}, "temperature", "Temperature must be between 0 and 2."),
        ({"temperature": "warm"}, "temperature", "Temperature must be a number."),
        ({"temperature": "nan"}, "temperature", "Temperature must be a number."),
        ({"top_p": 0}, "top_p", "Top-p must be between 0.05 and 1."),
        ({"max_new_tokens": 0}, "max_new_tokens", "Max new tokens must be between 1 and 1024."),
        ({"max_new_tokens": 5000}, "max_new_tokens", "Max new tokens must be between 1 and 1024."),
        ({"max_new_tokens": 2.5}, "max_new_tokens", "Max new tokens must be a whole number."),
        ({"system_prompt": "x" * 2001}, "system_prompt", "limited to 2,000 characters"),
        ({"seed": 1}, "seed", "Not a setting."),
    ],
)
def test_bad_settings_are_refused_with_what_is_wrong(conversation, given, field, words):
    with pytest.raises(conversations.ConversationInvalid) as refused:
        conversations.conversation_settings_update(conversation, given)
    assert words in refused.value.errors[field]
    assert set(refused.value.errors) == {field}
    fresh = Conversation.objects.get(pk=conversation.pk)
    assert conversations.conversation_fields(fresh) == conversations.conversation_fields(
        conversation
    )  # nothing saved


def test_saving_settings_tells_the_browsers_and_keeps_the_rest(alice, bob, conversation):
    with EventTap(conversation.pk) as tap:
        conversations.conversation_settings_update(
            conversation, {"temperature": "0", "max_new_tokens": 12}
        )
        said = tap.settle()
    saved = Conversation.objects.get(pk=conversation.pk)
    assert (saved.temperature, saved.max_new_tokens) == (0.0, 12)
    assert saved.top_p == conversation.top_p and saved.system_prompt == conversation.system_prompt
    [event] = [e for e in said if e["type"] == "conversation.state"]
    assert event["conversation"]["settings"]["max_new_tokens"] == 12
    assert not chat_sampling(saved).do_sample  # temperature 0 is greedy

    url = f"/c/{conversation.pk}/settings"
    bad = client_for(alice).post(url, {"top_p": 2}, content_type="application/json")
    assert bad.status_code == 422
    assert bad.json()["errors"] == {"top_p": "Top-p must be between 0.05 and 1."}
    good = client_for(alice).post(url, {"image_by_default": True}, content_type="application/json")
    assert good.json()["conversation"]["settings"]["image_by_default"] is True
    other = client_for(bob).post(url, {"top_p": 0.5}, content_type="application/json")
    assert other.status_code == 404


def test_a_refused_first_turn_with_bad_settings_saves_nothing(alice):
    answer = client_for(alice).post(
        "/c/new/turns",
        {"text": "Hi", "settings": {"temperature": 9}},
        content_type="application/json",
    )
    assert answer.status_code == 422
    assert answer.json()["errors"] == {"temperature": "Temperature must be between 0 and 2."}
    assert not Conversation.objects.exists()


@pytest.mark.model
def test_the_history_builder_and_the_reply_use_the_conversations_settings(alice, engine_in_process):
    tokenizer = engine_in_process.tokenizer
    answer = client_for(alice).post(
        "/c/new/turns",
        {
            "text": "Tell me a long story about a lighthouse.",
            "settings": {"system_prompt": "Answer like a pirate.", "max_new_tokens": "6"},
        },
        content_type="application/json",
    )
    assert answer.status_code == 201, answer.content
    conversation = Conversation.objects.get(owner=alice)
    assert (conversation.system_prompt, conversation.max_new_tokens) == (
        "Answer like a pirate.",
        6,
    )
    part_id = answer.json()["reply"]["parts"][0]["id"]
    wait_until(lambda: Part.objects.get(pk=part_id).state == Part.State.SUCCEEDED, 60, "the reply")
    part = Part.objects.get(pk=part_id)
    assert part.completion_tokens == 6 and part.finish_reason == "length"

    first = conversation.messages.get(position=0)
    prompt = history.build(tokenizer, first, 2000, conversation.system_prompt)
    assert "Answer like a pirate." in tokenizer.decode(prompt.token_ids)
    bare = history.build(tokenizer, first, 2000, "")
    assert "pirate" not in tokenizer.decode(bare.token_ids)

    conversations.conversation_settings_update(conversation, {"max_new_tokens": 3})
    reply = services.turn_create(alice, conversation, "And another?", False)
    later = reply.parts.get()
    wait_until(lambda: Part.objects.get(pk=later.pk).state == "succeeded", 60, "the reply")
    assert Part.objects.get(pk=later.pk).completion_tokens == 3


def test_a_setting_never_set_follows_its_default_and_emptying_one_returns_to_it(conversation):
    with override_settings(TANDEM_CHAT_TEMPERATURE=0.9, TANDEM_CHAT_MAX_NEW_TOKENS=50):
        assert chat_sampling(conversation).temperature == 0.9  # read when the reply starts
        conversations.conversation_settings_update(conversation, {"temperature": 0.1})
        assert chat_sampling(conversation).temperature == 0.1
        conversations.conversation_settings_update(conversation, {"temperature": ""})
        saved = Conversation.objects.get(pk=conversation.pk)
        assert saved.temperature is None and chat_sampling(saved).temperature == 0.9
        assert chat_sampling(saved).max_new_tokens == 50
