"""The bench tests reuse the engine suite's tokenizer and tiny random model."""

from tests.engine.conftest import tiny_model, tokenizer

__all__ = ["tiny_model", "tokenizer"]
