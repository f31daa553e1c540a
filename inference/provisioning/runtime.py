"""The web process's one model and engine: loaded once, in the background, with a state.

States: idle (not started in this process), loading, ready, error, disabled
(TANDEM_LOAD_MODEL=0), remote (TANDEM_ENGINE names URLs: no model here, the text streams from
`remote`, see remote_engine.py). /health, the API views and the ops page all read this one
object.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings

from inference.provisioning.errors import ModelUnavailable

if TYPE_CHECKING:
    from inference.engine import Engine, EngineStats
    from inference.provisioning.loading import LoadedModel
    from inference.provisioning.remote_engine import RemoteEngine

log = logging.getLogger(__name__)

# Loads the model and starts its engine: `startup.start_engine` in the web process. It is handed
# in rather than imported because it imports torch, which the other readers of this module
# (AppConfig.ready() in every process, Celery workers, management commands) never need.
Loader = Callable[[], "tuple[LoadedModel, Engine]"]


@dataclass
class ModelRuntime:
    """Holds the loaded model, its running engine and how loading went, under a lock."""

    state: str = "idle"
    error: str = ""
    loaded: LoadedModel | None = None
    engine: Engine | None = None
    remote: RemoteEngine | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self, load: Loader) -> None:
        """Begin loading with `load` in a daemon thread; later calls do nothing."""
        with self._lock:
            if self.state != "idle":
                return
            if settings.TANDEM_ENGINE_URLS:
                from inference.provisioning.remote_engine import RemoteEngine

                self.remote = RemoteEngine(settings.TANDEM_ENGINE_URLS).start()
                self.state = "remote"
                return
            if not settings.TANDEM_LOAD_MODEL:
                self.state = "disabled"
                return
            self.state = "loading"
            self._thread = threading.Thread(
                target=self._load, args=(load,), name="model-loader", daemon=True
            )
            self._thread.start()

    def _load(self, load: Loader) -> None:
        try:
            loaded, engine = load()
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

    def engine_stats(self) -> EngineStats | None:
        """The running engine's stats; None while this process has none."""
        engine = self.engine
        return engine.stats() if engine is not None else None

    def snapshot(self) -> dict[str, object]:
        """State plus details for /health and operators."""
        with self._lock:
            info: dict[str, object] = {"state": self.state}
            if self.error:
                info["error"] = self.error
            if self.loaded is not None:
                info.update(self.loaded.describe())
            if self.engine is not None:
                runner = self.engine.runner
                info["compile"] = getattr(runner, "compile_state", "off")
                info["attention"] = getattr(runner, "attention_kind", "fused")
                info["chunk_attention"] = getattr(runner, "chunk_kind", "sdpa")
                buckets = getattr(runner, "compile_buckets", {})
                if buckets:
                    info["compile_buckets"] = buckets
            if self.remote is not None:
                info["engines"] = self.remote.snapshot()
            return info


model_runtime = ModelRuntime()


def start_background_load(load: Loader) -> None:
    """Start loading the configured model in this process (the web process calls this)."""
    model_runtime.start(load)
