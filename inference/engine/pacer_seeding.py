"""The pacer seeded with the compiled step's warm-up timings (docs/engine.md, "The prefill
budget").

Measured steps teach the pacer one bucket at a time, and with nothing measured near a bucket,
prefill beside decoders gets only the floor (`MIN_CHUNK`). The compiled graphs are timed per
bucket while they warm up, so their times give the pacer every bucket from its first steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine.model_runner import ModelRunner
    from inference.engine.pacing import PrefillPacer


def seed_pacer(pacer: PrefillPacer, runner: ModelRunner) -> bool:
    """Seed `pacer` with the runner's per-bucket step times once its compiled step is warm;
    whether it did. A runner without one, or still compiling, seeds nothing: ask again next
    step."""
    compiled = getattr(runner, "compiled", None)
    if compiled is not None and compiled.ready:
        pacer.seed(compiled.step_seconds, compiled.alone_seconds, compiled.key_seconds)
        return True
    return False
