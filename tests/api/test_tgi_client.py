"""Hugging Face's own `text-generation` client, unmodified, against Tandem.

The client pins huggingface-hub<1, which breaks transformers 5, so it lives in a virtualenv
of its own under var/ and runs as a separate process.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

CLIENT_VERSION = "0.7.0"
CLIENT_VENV = ROOT / "var" / f"text-generation-{CLIENT_VERSION}"

SCRIPT = """
import json, sys
from text_generation import Client
from text_generation.errors import ValidationError

client = Client(sys.argv[1], timeout=120)
out = {}
reply = client.generate("The capital of France is", max_new_tokens=6)
out["text"] = reply.generated_text
out["finish"] = reply.details.finish_reason.value
out["tokens"] = len(reply.details.tokens)
pieces, last = [], None
for event in client.generate_stream("The capital of France is", max_new_tokens=6):
    if not event.token.special:
        pieces.append(event.token.text)
    last = event
out["streamed"] = "".join(pieces)
out["stream_final"] = last.generated_text
out["stream_finish"] = last.details.finish_reason.value
seeded = [client.generate("Once", max_new_tokens=6, do_sample=True, seed=42).generated_text
          for _ in range(2)]
out["seeded_equal"] = seeded[0] == seeded[1]
try:
    client.generate("x" * 20000, max_new_tokens=2)
except ValidationError as error:
    out["validation"] = str(error)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def client_python() -> Path:
    python = CLIENT_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(CLIENT_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"text-generation=={CLIENT_VERSION}"],
            check=True,
            timeout=600,
        )
    return python


def test_text_generation_client_works_unmodified(engine_server, client_python):
    result = subprocess.run(
        [str(client_python), "-c", SCRIPT, engine_server.url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["text"].startswith(" Paris")
    assert out["finish"] == "length" and out["tokens"] == 6
    assert out["streamed"] == out["stream_final"] == out["text"]
    assert out["stream_finish"] == "length"
    assert out["seeded_equal"] is True
    assert "tokens" in out["validation"]
