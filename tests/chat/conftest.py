"""Chat fixtures: users, conversations, and the real engine running in the test process."""

import pytest
from django.contrib.auth import get_user_model

from chat import text_stream
from chat.models import Conversation
from config.redis_client import RedisGate
from inference.engine import Engine, EngineConfig
from inference.provisioning import loading
from inference.provisioning.runtime import model_runtime


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", password="alice-pass")


@pytest.fixture
def bob(db):
    return get_user_model().objects.create_user("bob", password="bob-pass")


@pytest.fixture
def conversation(alice):
    return Conversation.objects.create(owner=alice)


@pytest.fixture(scope="session")
def real_engine():
    """SmolLM2 in float32 behind a real engine, as the web process has it."""
    loaded = loading.load(None, "float32")
    engine = Engine(loaded.model, loaded.tokenizer, EngineConfig(max_seq_len=2048)).start()
    yield loaded, engine
    engine.shutdown()


@pytest.fixture
def engine_in_process(real_engine, monkeypatch):
    """Make this process's runtime serve the real engine, as Daphne's does after loading."""
    loaded, engine = real_engine
    monkeypatch.setattr(model_runtime, "engine", engine)
    monkeypatch.setattr(model_runtime, "loaded", loaded)
    monkeypatch.setattr(model_runtime, "state", "ready")
    return engine


@pytest.fixture(autouse=True)
def writer_believes_redis_is_up(monkeypatch):
    """The text writer's Redis gate starts open: a test that pointed REDIS_URL at nothing
    leaves it closed, and the next test's first pieces would skip the tail and the browsers."""
    monkeypatch.setattr(text_stream.writer, "_redis", RedisGate())
