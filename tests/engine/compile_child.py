"""A process that builds or loads a tiny model's compiled buckets from a cache directory.

`python -m tests.engine.compile_child CACHE_DIR WEIGHTS` prints one JSON line: each bucket's
state, how many times this process compiled a package, a greedy reply through the graphs,
and the unpacked packages' directories it maps files from. The cache tests run it as a
fresh process, as a restart would be.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.compile_cache import CompileCache
from inference.engine.kv_cache import KVCache
from inference.engine.package_loading import unpacked_folders
from inference.engine.weights.choice import build_runner
from tests.engine.helpers import sharpen, tiny_config

BUCKETS = (1, 2)
PROMPT = [5, 600, 7000, 31]


def main(cache_dir: Path, weights: str) -> None:
    torch.manual_seed(7)
    model = sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config())))
    if weights == "int8":
        model = model.to(torch.bfloat16)
    runner = build_runner(model, weights, None, cache=CompileCache(cache_dir))
    builds = 0
    build = torch._inductor.aoti_compile_and_package

    def counted(*args, **kwargs):
        nonlocal builds
        builds += 1
        return build(*args, **kwargs)

    torch._inductor.aoti_compile_and_package = counted
    runner.compile_decode(BUCKETS, cache_dir).join()
    tokens = []
    with torch.inference_mode():
        cache = KVCache(runner.kv_spec, 1, 64)
        slot = cache.allocate()
        cache.extend(slot, len(PROMPT))
        batch = StepBatch(chunks=[PrefillChunk(slot, 0, PROMPT, needs_logits=True)])
        logits = runner.forward(batch, cache)
        for position in range(len(PROMPT), len(PROMPT) + 6):
            token = int(logits[0].argmax())
            tokens.append(token)
            cache.extend(slot, 1)
            batch = StepBatch(
                decode_slots=[slot], decode_token_ids=[token], decode_positions=[position]
            )
            logits = runner.forward(batch, cache)
    report = {
        "state": runner.compile_state,
        "weights": runner.weights,
        "buckets": {str(size): s["state"] for size, s in runner.compile_buckets.items()},
        "builds": builds,
        "tokens": tokens,
        "unpacked": sorted(str(folder) for folder in unpacked_folders()),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
