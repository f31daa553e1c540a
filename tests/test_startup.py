"""What the web process's start-up leaves behind: the model and its engine, with what start-up
made out of the garbage collector's sight (a full collection walked all of it, stalling
every stream for hundreds of ms)."""

import gc

import pytest
import torch

from inference.provisioning import startup


@pytest.fixture
def unfrozen():
    threads = torch.get_num_threads()
    gc.unfreeze()
    yield
    gc.unfreeze()
    torch.set_num_threads(threads)


def test_start_up_freezes_what_it_made_and_later_objects_are_collected(settings, unfrozen):
    settings.TANDEM_ENGINE_SOURCE = "synthetic"
    loaded, engine = startup.start_engine()
    try:
        assert gc.get_freeze_count() > 0
        seen = {id(obj) for obj in gc.get_objects()}
        assert id(loaded.tokenizer) not in seen and id(engine) not in seen
        later = [["made after start-up"]]  # a list: always tracked
        assert any(obj is later for obj in gc.get_objects())
    finally:
        engine.shutdown()
