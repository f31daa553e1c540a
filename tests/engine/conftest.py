"""Engine test fixtures: the SmolLM2 tokenizer, a tiny random Llama, the real model, engines.

Every engine a test makes is shut down at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from inference.engine import Engine, EngineConfig, EngineObserver
from inference.provisioning import loading, model_source
from tests.engine.helpers import sharpen, tiny_config


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer, from the converted local model directory."""
    return AutoTokenizer.from_pretrained(model_source.resolve(None).directory)


@pytest.fixture(scope="session")
def tiny_model() -> PreTrainedModel:
    """A 2-layer random Llama with SmolLM2's vocabulary, built in a second."""
    torch.manual_seed(0)
    return sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config())))


@pytest.fixture(scope="session")
def smollm() -> loading.LoadedModel:
    """The real SmolLM2-135M-Instruct in float32, loaded once per session."""
    return loading.load(None, "float32")


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    """Factory: Engine(model, tokenizer, EngineConfig(**config), ...), shut down afterwards."""
    engines: list[Engine] = []

    def make(
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        *,
        start: bool = True,
        observer: EngineObserver | None = None,
        runner: object | None = None,
        **config: object,
    ) -> Engine:
        engine = Engine(model, tokenizer, EngineConfig(**config), observer=observer, runner=runner)
        engines.append(engine)
        return engine.start() if start else engine

    yield make
    for engine in engines:
        engine.shutdown()
