"""Loading the configured model and starting its engine, wired to the metrics and the ops window.

Everything here imports torch, so only the web process imports it (config/asgi.py), and hands
`start_engine` to the runtime, whose state every process reads without torch.
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import torch
from django.conf import settings

from inference.engine import Engine, EngineConfig
from inference.engine.compile_cache import CompileCache
from inference.engine.model_runner import ModelRunner
from inference.engine.weights.choice import build_runner
from inference.provisioning import loading, model_source, synthetic
from inference.provisioning.metrics_observer import PrometheusObserver
from inference.provisioning.recent_stats import ObserverChain, recent_stats


def engine_config() -> EngineConfig:
    """The engine's limits from settings."""
    return EngineConfig(
        max_running=settings.TANDEM_MAX_RUNNING,
        max_waiting=settings.TANDEM_MAX_WAITING,
        max_step_tokens=settings.TANDEM_MAX_STEP_TOKENS,
        max_seq_len=settings.TANDEM_MAX_SEQ_LEN,
        prefix_reuse=settings.TANDEM_PREFIX_REUSE,
    )


def load_source() -> tuple[loading.LoadedModel, ModelRunner | None, threading.Thread | None]:
    """The model, or (TANDEM_ENGINE_SOURCE=synthetic, benchmarks only) a paced stand-in, and
    the thread building its compiled step (None: no compiled step)."""
    if settings.TANDEM_ENGINE_SOURCE == "synthetic":
        # Its logits only name a token: one thread does that, and leaves the other cores to
        # the server it stands in for.
        torch.set_num_threads(settings.TANDEM_TORCH_THREADS or 1)
        return *synthetic.load(settings.TANDEM_MODEL, settings.TANDEM_SYNTHETIC_TOKENS_PER_S), None
    if settings.TANDEM_TORCH_THREADS:
        torch.set_num_threads(settings.TANDEM_TORCH_THREADS)
    loaded = loading.load(settings.TANDEM_MODEL, settings.TANDEM_DTYPE)
    cache_dir = compile_cache_dir()
    cache = CompileCache(cache_dir) if cache_dir is not None else None
    runner = build_runner(loaded.model, settings.TANDEM_WEIGHTS, loaded.gguf, cache=cache)
    loaded.weights = runner.weights
    compiling = None
    if settings.TANDEM_COMPILE:
        compiling = runner.compile_decode(settings.TANDEM_COMPILE_BUCKETS, cache_dir)
    return loaded, runner, compiling


def compile_cache_dir() -> Path | None:
    """Where the compiled buckets are kept (TANDEM_COMPILE_CACHE); None: nowhere."""
    setting = settings.TANDEM_COMPILE_CACHE.strip()
    if setting.lower() == "off":
        return None
    return Path(setting).expanduser() if setting else model_source.default_cache_dir() / "compiled"


def start_engine() -> tuple[loading.LoadedModel, Engine]:
    """Load the source and start an engine over it that feeds Prometheus and `recent_stats`;
    then put what start-up made out of the garbage collector's sight."""
    loaded, runner, compiling = load_source()
    observer = ObserverChain(PrometheusObserver(), recent_stats)
    engine = Engine(
        loaded.model, loaded.tokenizer, engine_config(), observer=observer, runner=runner
    ).start()
    freeze_heap()
    if compiling is not None:
        threading.Thread(
            target=freeze_heap, args=(compiling,), name="tandem-freeze", daemon=True
        ).start()
    return loaded, engine


def freeze_heap(after: threading.Thread | None = None) -> None:
    """Move every object alive now (torch, transformers, the model and its tokenizer, Django,
    a compiled step's graphs) to the collector's permanent generation; once `after` has
    ended, when given (the compiled step's build).

    A full collection walks every tracked object with the GIL held: in a web process with
    the engine loaded it took 300-400 ms at a thousand readers (docs/benchmarks.md), a stall
    of every stream and of the engine's steps. What is made later is collected as before;
    what start-up left as garbage goes first. Objects of requests served while the model
    loads are frozen with the rest, once.
    """
    if after is not None:
        after.join()
    gc.collect()
    gc.freeze()
