"""The web process's one model and engine: loaded once, in the background, with a state.

States: idle (not started in this process), loading, ready, error, disabled
(TANDEM_LOAD_MODEL=0). /health, the API views and the ops page all read this one object.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from django.conf import settings

from inference import loading
from inference.engine import Engine, EngineConfig
from inference.engine.model_runner import ModelRunner
from inference.engine.weights.choice import build_runner
from inference.errors import ModelUnavailable

log = logging.getLogger(__name__)


def engine_config() -> EngineConfig:
    """The engine's limits from settings."""
    return EngineConfig(
        max_running=settings.TANDEM_MAX_RUNNING,
        max_waiting=settings.TANDEM_MAX_WAITING,
        max_step_tokens=settings.TANDEM_MAX_STEP_TOKENS,
        max_seq_len=settings.TANDEM_MAX_SEQ_LEN,
    )


def load_source() -> tuple[loading.LoadedModel, ModelRunner | None]:
    """The model, or (TANDEM_ENGINE_SOURCE=synthetic, benchmarks only) a paced stand-in."""
    if settings.TANDEM_ENGINE_SOURCE == "synthetic":
        from inference import synthetic

        return synthetic.load(settings.TANDEM_MODEL, settings.TANDEM_SYNTHETIC_TOKENS_PER_S)
    loaded = loading.load(settings.TANDEM_MODEL, settings.TANDEM_DTYPE)
    runner = build_runner(loaded.model, settings.TANDEM_WEIGHTS, loaded.gguf)
    loaded.weights = runner.weights
    return loaded, runner


@dataclass
class ModelRuntime:
    """Holds the loaded model, its running engine and how loading went, under a lock."""

    state: str = "idle"
    error: str = ""
    loaded: loading.LoadedModel | None = None
    engine: Engine | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin loading in a daemon thread; later calls do nothing."""
        with self._lock:
            if self.state != "idle":
                return
            if not settings.TANDEM_LOAD_MODEL:
                self.state = "disabled"
                return
            self.state = "loading"
            self._thread = threading.Thread(target=self._load, name="model-loader", daemon=True)
            self._thread.start()

    def _load(self) -> None:
        from inference.metrics import PrometheusObserver
        from inference.recent_stats import ObserverChain, recent_stats

        try:
            loaded, runner = load_source()
            observer = ObserverChain(PrometheusObserver(), recent_stats)
            engine = Engine(
                loaded.model, loaded.tokenizer, engine_config(), observer=observer, runner=runner
            ).start()
        except (ModelUnavailable, ValueError) as exc:
            self._fail(str(exc))
            return
        except Exception as exc:  # any loader bug must still surface in /health, not vanish
            log.exception("model load failed")
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self.loaded = loaded
            self.engine = engine
            self.state = "ready"
        log.info("model ready %s", loaded.describe())

    def _fail(self, message: str) -> None:
        with self._lock:
            self.state = "error"
            self.error = message
        log.error("model unavailable: %s", message)

    def wait(self, timeout: float) -> str:
        """Block until loading ends or the timeout passes; returns the state."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.state

    def snapshot(self) -> dict[str, object]:
        """State plus details for /health and operators."""
        with self._lock:
            info: dict[str, object] = {"state": self.state}
            if self.error:
                info["error"] = self.error
            if self.loaded is not None:
                info.update(self.loaded.describe())
            return info


model_runtime = ModelRuntime()


def start_background_load() -> None:
    """Start loading the configured model in this process (the web process calls this)."""
    model_runtime.start()
