"""The long-prompt round sends the servers a prompt of the size it records."""

from bench.prefill import PROMPT_TOKENS, long_messages, templated_tokens


def test_the_long_message_is_templated_to_the_prompt_size(tokenizer):
    (message,) = long_messages(tokenizer)
    assert message["role"] == "user"
    size = templated_tokens(tokenizer, message["content"])
    # the most whole words that fit: one more word would pass the size
    assert PROMPT_TOKENS - 8 <= size <= PROMPT_TOKENS


def test_a_smaller_prompt_size_is_honoured(tokenizer):
    (message,) = long_messages(tokenizer, 300)
    assert 290 <= templated_tokens(tokenizer, message["content"]) <= 300
