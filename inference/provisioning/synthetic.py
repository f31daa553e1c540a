"""A synthetic token source for benchmarking the streaming path (TANDEM_ENGINE_SOURCE=synthetic).

It replaces only the model: a runner with no weights that answers every step, at a fixed
pace, with logits that pick the next token of a fixed text. Everything after the forward
pass is the real thing (engine loop, sampler, detokenizer, events, the chat's writer thread,
Redis, the channel layer, Daphne), so bench/stream.py measures the streaming path's cost,
not the model's. Never selected unless the setting asks for it.
"""

from __future__ import annotations

import time

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from inference.engine.batch import StepBatch
from inference.engine.kv_cache import KVCache, KVSpec
from inference.provisioning import model_source
from inference.provisioning.errors import ModelUnavailable
from inference.provisioning.loading import LoadedModel

TEXT = (
    "Streaming text arrives one small piece at a time, and every piece travels from the engine "
    "through the writer thread, the live tail in Redis and the channel layer to each open "
    "socket. The reader sees the sentence grow word by word while the picture is still being "
    "drawn by a worker somewhere else. "
)
# Against zeros elsewhere the picked token wins at any temperature up to 2 (every other
# token together: 49,151 * e^-40). Not more: e^-100 is a float32 denormal, and the engine's
# log-probabilities (logsumexp over each row) took 26 ms a step on it against 1.5 ms at 80.
PICKED_LOGIT = 80.0


class SyntheticRunner:
    """A ModelRunner stand-in: one step every 1/tokens_per_s seconds, cycling through TEXT.

    The token for a row depends only on its position, so every stream reads the same text
    and each token decodes to a visible piece (one `part.delta` per token). The KV cache is
    one float per position: the engine's bookkeeping runs as usual at negligible cost.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, tokens_per_s: float, context_length: int = 4096
    ) -> None:
        if tokens_per_s <= 0:
            raise ValueError("TANDEM_SYNTHETIC_TOKENS_PER_S must be above 0.")
        self.pieces = tokenizer.encode(TEXT, add_special_tokens=False)
        self.vocab_size = len(tokenizer)
        self.context_length = context_length
        self.kv_spec = KVSpec(1, 1, 1, torch.float32, torch.device("cpu"))
        self.interval = 1.0 / tokens_per_s
        self._next_step = 0.0

    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        """Wait for this step's slot in the pace, then return logits that pick one token per row."""
        positions = list(batch.decode_positions)
        positions += [c.start + len(c.token_ids) - 1 for c in batch.chunks if c.needs_logits]
        picks = torch.tensor([self.pieces[p % len(self.pieces)] for p in positions])
        logits = torch.zeros(len(positions), self.vocab_size)
        logits[torch.arange(len(positions)), picks] = PICKED_LOGIT
        now = time.monotonic()
        if self._next_step > now:
            time.sleep(self._next_step - now)
        self._next_step = max(now, self._next_step) + self.interval
        return logits


def load(setting: str | None, tokens_per_s: float) -> tuple[LoadedModel, SyntheticRunner]:
    """The configured model's tokenizer (no weights) and a synthetic runner at the given pace."""
    started = time.perf_counter()
    source = model_source.resolve(setting)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(
            f"Could not load the tokenizer from {source.directory}: {exc}"
        ) from exc
    runner = SyntheticRunner(tokenizer, tokens_per_s)
    loaded = LoadedModel(
        name=f"synthetic-{tokens_per_s:g}-tok-s({source.name})",
        model=None,
        tokenizer=tokenizer,
        dtype=torch.float32,
        device=torch.device("cpu"),
        parameters=0,
        load_seconds=time.perf_counter() - started,
        converted_now=source.converted_now,
    )
    return loaded, runner
