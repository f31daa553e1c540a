"""Hugging Face's maintained client for TGI servers, `huggingface_hub.InferenceClient`,
unmodified, against Tandem's TGI routes (the deprecated `text-generation` package is no
longer needed, nor a virtualenv of its own)."""

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


def test_inference_client_works_unmodified(engine_server):
    client = InferenceClient(base_url=engine_server.url, timeout=120)
    reply = client.text_generation("The capital of France is", max_new_tokens=6, details=True)
    assert reply.generated_text.startswith(" Paris")
    assert reply.details.finish_reason == "length" and len(reply.details.tokens) == 6

    events = list(
        client.text_generation(
            "The capital of France is", max_new_tokens=6, stream=True, details=True
        )
    )
    streamed = "".join(event.token.text for event in events if not event.token.special)
    assert streamed == events[-1].generated_text == reply.generated_text
    assert events[-1].details.finish_reason == "length"

    seeded = [
        client.text_generation("Once", max_new_tokens=6, do_sample=True, seed=42) for _ in range(2)
    ]
    assert seeded[0] == seeded[1]

    # TGI's error body ({"error", "error_type": "validation"}) becomes the client's own error.
    with pytest.raises(ValidationError, match="fit the context window"):
        client.text_generation("x" * 20000, max_new_tokens=2)
